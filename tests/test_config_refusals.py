"""A config transformers refuses is one line naming why, however transformers words it.

Since transformers 5 a config validates its values with huggingface_hub's strict dataclasses, whose
errors derive from Exception alone and put the reason on a second line, under the validator's name.
Truth: transformers' own refusal of the same file (its cause's message).
"""
from __future__ import annotations

import json

import pytest

from lmprof.errors import first_line
from tests.conftest import one_line_error

tf = pytest.importorskip("transformers")


def _zaya_top2(tmp_path):
    path = tmp_path / "zaya.json"
    cfg = tf.AutoConfig.for_model("zaya").to_dict()
    cfg.update(num_experts_per_tok=2)
    path.write_text(json.dumps(cfg))
    try:
        tf.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers' own refusal: the reason the line must give
        return path, str(exc.__cause__ or exc).splitlines()[0]
    pytest.skip("this transformers accepts ZAYA with top-2 experts")


def test_train_and_memory_refuse_a_config_transformers_validates_away_in_one_line(cli, tmp_path) -> None:
    path, reason = _zaya_top2(tmp_path)
    code, _, err = cli("train", "--hf-config", path, "--steps", "1", "--warmup", "1", "--profile-steps", "1",
                       "--device", "cpu", "--out", tmp_path / "runs")
    one_line_error(code, err, "cannot read the Hugging Face config", reason)
    code, _, err = cli("memory", "--model", path, "--batch-size", "1", "--seq-len", "16")
    one_line_error(code, err, "cannot read this 'zaya' config", reason)


def test_first_line_takes_the_cause_under_an_introducing_line_and_cuts_after_a_sentence() -> None:
    try:
        try:
            raise ValueError("the real reason.")
        except ValueError as inner:
            raise RuntimeError("Class validation error for validator 'x':\n    ValueError: the real reason.") from inner
    except RuntimeError as exc:
        assert first_line(exc) == "the real reason."
    assert first_line(RuntimeError("intro:\n  detail")) == "intro: detail"
    assert first_line(RuntimeError("One. " + "x" * 300), most=50) == "One."
    assert first_line(RuntimeError("y" * 60), most=50) == "y" * 50 + "..."
    assert first_line(KeyError()) == "KeyError"
