"""analysis/what_if.py without the CLI: the roofline of a query, against hand arithmetic."""
from __future__ import annotations

import pytest

from lmprof.analysis.what_if import RooflineQuery, parse_batches, roofline_what_if
from lmprof.errors import ConfigError, DeviceError
from lmprof.hardware.peaks import load_table


def test_decode_sweep_reads_the_weights_once_at_batch_one():
    answer = roofline_what_if(RooflineQuery(device="h100", model="llama-3-8b", context=128,
                                            sweep_batches=(1, 4096)), load_table(use_user=False))
    assert answer.phase == "decode" and answer.kv_len == 128 and answer.result is None
    # 2 bytes x 7,504,658,432 matmul weights / 3.35 TB/s, plus a little for norms, activations and KV
    assert answer.sweep[0].time_s == pytest.approx(2 * 7_504_658_432 / 3.35e12, rel=0.01)
    assert answer.compute_bound_from_batch == 4096


def test_prefill_total_is_the_sum_of_block_roofline_times():
    answer = roofline_what_if(RooflineQuery(device="a100", preset="tiny", seq_len=64, batch_size=2),
                              load_table(use_user=False))
    dev = answer.device
    assert answer.result is not None and len(answer.costs) == len(answer.points)
    by_hand = sum(max(c.flops / dev.flops_per_s, c.bytes / dev.bytes_per_s) for c in answer.costs)
    assert answer.result.time_s == pytest.approx(by_hand)
    assert answer.result.tokens == 2 * 64


@pytest.mark.parametrize("kwargs, text", [
    ({"device": None}, "--device is required"),
    ({"device": "h100", "phase": "sideways"}, "unknown phase"),
    ({"device": "h100", "batch_size": 0}, "--batch-size"),
    ({"device": "h100", "n_embd": 2**31}, "--n-embd"),
])
def test_a_bad_query_is_refused_when_made(kwargs, text):
    with pytest.raises(ConfigError, match=text):
        RooflineQuery(**kwargs)


def test_bad_answers_are_one_error_each():
    table = load_table(use_user=False)
    with pytest.raises(DeviceError, match="unknown device"):
        roofline_what_if(RooflineQuery(device="no-such-gpu", preset="tiny"), table)
    with pytest.raises(ConfigError, match="attention must be"):
        roofline_what_if(RooflineQuery(device="h100", preset="tiny", attention="flash"), table)
    with pytest.raises(ConfigError, match="integers"):
        parse_batches("1,x")
    assert parse_batches("1, 8,64") == (1, 8, 64)
