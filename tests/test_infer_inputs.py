"""What `lmprof infer` builds from its inputs: --prompt-ids as given, --n-layer honoured with
--hf-config (or refused in one line where it cannot apply), --tokenizer a local folder only."""
from __future__ import annotations

import pytest
import torch

from lmprof.cli.main import main
from lmprof.config import InferConfig, ModelSpec
from lmprof.errors import ConfigError, DataError
from lmprof.workloads.builders import _load_hf, _prompt_ids

LESSON_IDS = [464, 2003, 286, 11666, 4430, 318]  # GPT-2's tokens for "The future of artificial intelligence is"


def test_prompt_ids_are_the_prompt() -> None:
    notes: list[str] = []
    ids = _prompt_ids(InferConfig(hf_config="gpt2", prompt_ids=LESSON_IDS, batch_size=2), None, 50257, notes)
    assert ids.tolist() == [LESSON_IDS, LESSON_IDS] and not notes


def test_prompt_ids_refused_outside_the_vocabulary_or_with_a_prompt() -> None:
    with pytest.raises(ConfigError, match="not a token of this model"):
        _prompt_ids(InferConfig(prompt_ids=[1, 70]), None, 65, [])
    with pytest.raises(ConfigError, match="either --prompt or --prompt-ids"):
        _prompt_ids(InferConfig(prompt="hi", prompt_ids=[1]), None, 65, [])
    with pytest.raises(ValueError):
        InferConfig(prompt_ids=[])


def test_bytes_fallback_says_how_to_get_real_tokens() -> None:
    notes: list[str] = []
    ids = _prompt_ids(InferConfig(prompt="Hi"), None, 65, notes)
    assert ids.tolist() == [[ord("H") % 65, ord("i") % 65]] and "--prompt-ids" in notes[0]


def test_tokenizer_must_be_a_local_folder(tmp_path) -> None:
    with pytest.raises(DataError, match="not a folder"):
        _prompt_ids(InferConfig(prompt="Hi", tokenizer=str(tmp_path / "none")), None, 65, [])
    with pytest.raises(DataError, match="cannot load a tokenizer"):
        _prompt_ids(InferConfig(prompt="Hi", tokenizer=str(tmp_path)), None, 65, [])


@pytest.mark.parametrize("name", ["gpt2", "qwen2.5-0.5b"])
@pytest.mark.slow
def test_n_layer_is_honoured_with_hf_config(name: str) -> None:
    model = _load_hf(ModelSpec(hf_config=name, n_layer=1), torch.float32, 0).model
    assert model.config.num_hidden_layers == 1
    layers = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)][0]
    assert len(layers) == 1


def test_resizing_refused_where_it_cannot_apply(tmp_path) -> None:
    with pytest.raises(ConfigError, match="--n-layer cannot resize --hf"):
        _load_hf(ModelSpec(hf=str(tmp_path), n_layer=1), torch.float32, 0)
    with pytest.raises(ConfigError, match="only --n-layer is honoured"):
        _load_hf(ModelSpec(hf_config="gpt2", n_embd=64), torch.float32, 0)


def test_cli_bad_prompt_ids_is_one_line(capsys) -> None:
    assert main(["infer", "--prompt-ids", "1,x", "--out", "/tmp/lmprof-never"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--prompt-ids takes comma-separated integers" in err[0]
