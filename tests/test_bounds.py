"""Model configs and CLI numbers without bounds (issue 29 item 9): every value either works or is
one line naming the field and its range, exit 2, never a traceback or a run until memory runs out."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmprof.errors import LmprofError
from lmprof.estimate.models import known_config, shape_from_config
from lmprof.estimate.shape import LIMITS, ModelShape

LLAMA = known_config("llama-3-8b")
MIXTRAL = known_config("mixtral-8x7b")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # roofline draws its PNG into the working directory


def _one_line_exit_2(code: int, err: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("cfg, key, value", [
    (LLAMA, "num_hidden_layers", 10**30),
    (LLAMA, "num_hidden_layers", 1e30),
    (LLAMA, "num_key_value_heads", 0),
    (LLAMA, "head_dim", 0),
    (LLAMA, "intermediate_size", 2**62),
    (MIXTRAL, "num_local_experts", 10**12),
])
def test_config_field_out_of_range_is_one_line_naming_it(tmp_path, cli, cfg, key, value):
    with pytest.raises(LmprofError, match=f"config {key} must be .*between"):
        shape_from_config({**cfg, key: value})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, key: value}))
    for command in (["roofline", "--model", path, "--device", "h100"], ["memory", "--model", path, "--device", "h100"]):
        code, _, err = cli(*command)
        _one_line_exit_2(code, err)
        assert key in err and "between" in err


def test_sweep_batch_and_gpus_beyond_any_machine_are_refused(cli):
    code, _, err = cli("roofline", "--preset", "tiny", "--sweep-batch", f"1,{10**20}")
    _one_line_exit_2(code, err)
    assert "--sweep-batch" in err and "2,147,483,647" in err
    code, _, err = cli("memory", "--preset", "tiny", "--gpus", str(10**20), "--device", "h100")
    _one_line_exit_2(code, err)
    assert "--gpus" in err
    code, _, err = cli("memory", "--preset", "tiny", "--gpus", str(2**21), "--device", "h100")
    _one_line_exit_2(code, err)
    assert "--gpus must be between 1 and 1,048,576" in err
    assert cli("memory", "--preset", "tiny", "--gpus", "8", "--shard", "zero3", "--device", "h100")[0] == 0


def test_built_in_gpt_dimensions_are_bounded_too():
    with pytest.raises(LmprofError, match="n_layer must be between 1 and 4,096"):
        ModelShape(n_layer=10**9, n_head=1, n_embd=8, vocab_size=8, block_size=8)
    with pytest.raises(LmprofError, match="n_kv_head must be between 1"):
        ModelShape(n_layer=1, n_head=2, n_embd=8, vocab_size=8, block_size=8, n_kv_head=0)


# -- property-based: any value of any field, in a config or on the command line ----------------------

_ANY = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-2, max_value=70_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=5),
)
_SIZE_KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size",
              "max_position_embeddings", "intermediate_size", "head_dim", "num_local_experts",
              "num_experts_per_tok", "sliding_window"]


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(key=st.sampled_from(_SIZE_KEYS), value=_ANY)
def test_any_config_value_gives_a_bounded_shape_or_a_config_error(key, value):
    try:
        shape = shape_from_config({**MIXTRAL, key: value})
    except LmprofError:
        return
    for field, (low, high) in LIMITS.items():
        v = getattr(shape, field)
        assert v is None or low <= v <= high, (field, v)
    assert shape.n_params() < 2**200  # every formula a plain, finite integer


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(_SIZE_KEYS), value=_ANY)
def test_any_config_value_on_the_cli_works_or_is_one_line(tmp_path, cli, key, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MIXTRAL, key: value}))
    code, _, err = cli("roofline", "--model", path, "--context", "64")
    assert code in (0, 2), err
    if code == 2:
        _one_line_exit_2(code, err)


_NUMBER_TEXT = st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str),
                         st.sampled_from(["0", "-1", "1e30", "nan", "", "1,2", "0x10", "9" * 40]))


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(["--gpus", "--batch-size", "--seq-len", "--n-layer", "--n-embd", "--context"]),
       value=_NUMBER_TEXT)
def test_any_memory_number_works_or_is_one_line(cli, option, value):
    code, _, err = cli("memory", "--preset", "tiny", "--device", "h100", "--mode", "infer", option, value)
    assert code in (0, 1, 2), err  # 1: does not fit (documented)
    if code == 2:
        assert "Traceback" not in err and err.strip()


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_NUMBER_TEXT, min_size=1, max_size=3))
def test_any_sweep_batch_works_or_is_one_line(cli, batches):
    code, _, err = cli("roofline", "--preset", "tiny", "--device", "h100", "--sweep-batch", ",".join(batches))
    assert code in (0, 2), err
    if code == 2:
        _one_line_exit_2(code, err)
