"""Random tokens for a Hugging Face model: its vocabulary read off the model (a multimodal config keeps
it in its text config) and its special tokens left out (an image token in random text makes the
model expect pixels). Truths: the model's own embedding table and config, torch.randint's stream."""
from __future__ import annotations

import json

import pytest
import torch

from lmprof.workloads.data import SyntheticBatches, random_tokens

tf = pytest.importorskip("transformers")


def test_no_special_token_is_drawn_and_every_other_id_can_be() -> None:
    gen = torch.Generator().manual_seed(0)
    ids = random_tokens(10, (20_000,), gen, avoid={0, 3, 9, 42, -1})
    assert set(ids.tolist()) == {1, 2, 4, 5, 6, 7, 8}


def test_with_nothing_to_avoid_the_stream_is_torch_randint() -> None:
    ours = next(SyntheticBatches(65, 2, 8, seed=3))[0]
    tokens = torch.randint(65, (2, 9), generator=torch.Generator().manual_seed(3))
    assert torch.equal(ours, tokens[:, :-1])


def test_a_vocabulary_of_special_tokens_only_is_one_line() -> None:
    from lmprof.errors import ConfigError

    with pytest.raises(ConfigError, match="every one of the model's 2 token ids"):
        random_tokens(2, (1,), torch.Generator(), avoid={0, 1})


def test_a_multimodal_models_vocabulary_and_image_token_come_from_the_model() -> None:
    from lmprof.measure.model_facts.tiny import tiny_config
    from lmprof.workloads.hf import context_length, token_space

    cfg = tiny_config("gemma3")
    assert not hasattr(cfg, "vocab_size")  # what made `lmprof train --hf-config` fail before
    cfg.image_token_index = 100  # inside the tiny vocabulary, as a real checkpoint's is inside its own
    model = tf.AutoModelForCausalLM.from_config(cfg)
    vocab, special = token_space(model)
    assert vocab == model.get_input_embeddings().num_embeddings == cfg.text_config.vocab_size
    assert 100 in special
    assert {cfg.text_config.pad_token_id, cfg.text_config.eos_token_id} <= special
    assert context_length(model) == cfg.text_config.max_position_embeddings


def test_lmprof_infer_runs_a_multimodal_config(cli, tmp_path) -> None:
    from lmprof.measure.model_facts.tiny import tiny_config

    path = tmp_path / "gemma3.json"
    path.write_text(json.dumps(tiny_config("gemma3").to_dict()))
    code, _, err = cli("infer", "--hf-config", path, "--steps", "1", "--warmup", "1", "--profile-steps", "1",
                       "--prompt-len", "8", "--new-tokens", "2", "--device", "cpu", "--energy", "off",
                       "--out", tmp_path / "runs")
    assert code == 0, err


def test_ids_stay_below_what_the_model_predicts_as_well_as_what_it_embeds() -> None:
    # Moshi embeds one more id (its padding) than it predicts: a label of 128 was out of bounds.
    from lmprof.measure.model_facts.tiny import tiny_config
    from lmprof.workloads.hf import token_space

    model = tf.AutoModelForCausalLM.from_config(tiny_config("moshi"))
    rows, classes = model.get_input_embeddings().num_embeddings, model.get_output_embeddings().out_features
    assert rows > classes
    assert token_space(model)[0] == classes


def test_a_config_without_a_position_limit_has_no_context_length() -> None:
    # XLNet says max_position_embeddings = -1 (relative positions): before, every run was refused with
    # "exceeds the model's context of -1".
    from lmprof.measure.model_facts.tiny import tiny_config
    from lmprof.workloads.hf import context_length

    cfg = tiny_config("xlnet")
    assert getattr(cfg, "max_position_embeddings", getattr(cfg, "n_positions", None)) == -1
    assert context_length(tf.AutoModelForCausalLM.from_config(cfg)) is None
