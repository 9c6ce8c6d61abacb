"""Recommendation rules on runs whose figures are chosen by hand, so the right answer is known."""
from __future__ import annotations

import pytest

from lmprof.analysis import advice
from lmprof.analysis.advice import advise
from lmprof.record.run import Block, Env, Metric, OpStat, Run


def make_run(*, mode="train", device="cpu", metrics=None, blocks=(), ops=(), config=None, env_extra=None) -> Run:
    env = dict(device=device, device_name="test device", torch="2", python="3", lmprof="0", os="linux",
               cpu="cpu", threads=1, **(env_extra or {}))
    return Run(id="r", mode=mode, created="2026-01-01T00:00:00Z", env=Env(**env),
               config=config or {"batch_size": 8, "optimizer": "adamw"},
               metrics={k: (v if isinstance(v, Metric) else Metric(value=v[0], unit=v[1], source="measured"))
                        for k, v in (metrics or {}).items()},
               blocks=list(blocks), ops=list(ops))


def blk(name: str, pct: float, phase: str = "forward") -> Block:
    return Block(name=name, phase=phase, time_ms=pct / 10, profiled_ms=pct / 10, pct=pct)


def rules(recs) -> dict:
    return {r.rule: r for r in recs}


def test_profiler_overhead_fires_at_45_pct_citing_it():
    recs = rules(advise(make_run(metrics={"profiler_overhead": (45.0, "%")})))
    rec = recs["profiler_overhead"]
    (ev,) = rec.evidence
    assert (ev.key, ev.value, ev.unit, ev.threshold) == ("profiler_overhead", 45.0, "%", advice.PROFILER_OVERHEAD_MAX_PCT)
    assert "45" in rec.why and "45" in ev.describe()


def test_profiler_overhead_silent_at_5_pct_and_when_missing():
    assert "profiler_overhead" not in rules(advise(make_run(metrics={"profiler_overhead": (5.0, "%")})))
    assert "profiler_overhead" not in rules(advise(make_run()))
    na = Metric.na("%", "no clean steps")
    assert "profiler_overhead" not in rules(advise(make_run(metrics={"profiler_overhead": na})))


def test_unfused_attention_at_30_pct_suggests_sdpa_citing_the_share():
    blocks = [blk("attn.scores", 12), blk("attn.softmax", 8), blk("attn.av", 6, "forward"), blk("attn.av", 4, "backward"),
              blk("mlp.fc", 70)]
    rec = rules(advise(make_run(blocks=blocks)))["attention_unfused"]
    assert rec.evidence[0].value == pytest.approx(30.0)
    assert rec.evidence[0].unit == "%" and rec.evidence[0].threshold == advice.ATTN_UNFUSED_MIN_PCT
    assert "--attention sdpa" in " ".join(rec.actions)
    assert "30.0%" in rec.why


def test_fused_attention_or_tiny_share_does_not_fire():
    fused = [blk("attn.sdpa", 30), blk("mlp.fc", 70)]
    assert "attention_unfused" not in rules(advise(make_run(blocks=fused)))
    small = [blk("attn.scores", 1), blk("attn.softmax", 1), blk("attn.av", 1), blk("mlp.fc", 97)]
    assert "attention_unfused" not in rules(advise(make_run(blocks=small)))


def test_hf_model_gets_attn_implementation_advice():
    rec = rules(advise(make_run(blocks=[blk("attn.scores", 20)], config={"hf": "gpt2"})))["attention_unfused"]
    assert "attn_implementation" in " ".join(rec.actions)


def test_overhead_bound_from_many_short_ops():
    # 2,000 calls in a 10 ms profiled step: 5 µs per call; matmuls 3 of 8 ms of self time (37.5%).
    ops = [OpStat(name="aten::add", calls=1500, self_ms=5.0, total_ms=5.0, self_pct=50),
           OpStat(name="aten::mm", calls=500, self_ms=3.0, total_ms=3.0, self_pct=30)]
    run = make_run(metrics={"profiled_step_time": (10.0, "ms")}, ops=ops)
    rec = rules(advise(run))["overhead_bound"]
    by_key = {e.key: e for e in rec.evidence}
    assert by_key["ops.calls_per_step"].value == 2000
    assert by_key["profiled step / ops.calls_per_step"].value == pytest.approx(5.0)
    assert by_key["ops matmul share of self time"].value == pytest.approx(37.5)
    assert any("--compile" in a for a in rec.actions) and not any("CUDA graphs" in a for a in rec.actions)
    compiled = make_run(metrics={"profiled_step_time": (10.0, "ms")}, ops=ops, config={"compile": True})
    assert not any("--compile" in a for a in rules(advise(compiled))["overhead_bound"].actions)
    # The trace's complete count wins over the top-operator lower bound.
    rec2 = rules(advise(run, {"ops_per_step": 4000.0}))["overhead_bound"]
    assert {e.key: e.value for e in rec2.evidence}["trace.ops_per_step"] == 4000


def test_overhead_bound_silent_for_long_ops():
    ops = [OpStat(name="aten::mm", calls=300, self_ms=90.0, total_ms=90.0, self_pct=90)]
    run = make_run(metrics={"profiled_step_time": (100.0, "ms")}, ops=ops)  # 333 µs per call
    assert "overhead_bound" not in rules(advise(run))


def test_overhead_bound_from_device_idle_on_gpu():
    run = make_run(device="cuda:0", blocks=[blk("idle", 35, "step"), blk("mlp.fc", 65)])
    rec = rules(advise(run))["overhead_bound"]
    assert rec.evidence[0].key == "blocks[idle].pct" and rec.evidence[0].value == 35
    # Trace analysis, when given, is the source of the idle share.
    rec = rules(advise(run, {"device_idle_pct": 50.0}))["overhead_bound"]
    assert rec.evidence[0].key == "trace.device_idle_pct" and rec.evidence[0].value == 50


def test_low_mfu_needs_mfu_and_matmul_share():
    blocks = [blk("attn.qkv", 20), blk("mlp.fc", 25), blk("mlp.proj", 25), blk("ln_1", 30)]
    rec = rules(advise(make_run(metrics={"mfu": (12.0, "%")}, blocks=blocks)))["low_mfu"]
    assert {e.key: e.value for e in rec.evidence}["mfu"] == 12.0
    assert "low_mfu" not in rules(advise(make_run(blocks=blocks)))  # no MFU recorded: no rule
    assert "low_mfu" not in rules(advise(make_run(metrics={"mfu": (55.0, "%")}, blocks=blocks)))


def test_host_sync_only_with_trace_facts():
    assert "host_sync" not in rules(advise(make_run()))
    rec = rules(advise(make_run(), {"sync_idle_pct": 12.5}))["host_sync"]
    assert rec.evidence[0].value == 12.5 and rec.evidence[0].threshold == advice.SYNC_IDLE_MIN_PCT
    assert "host_sync" not in rules(advise(make_run(), {"sync_idle_pct": 1.0}))


def test_optimizer_share():
    rec = rules(advise(make_run(blocks=[blk("optimizer", 22, "step"), blk("mlp.fc", 78)])))["optimizer_share"]
    assert rec.evidence[0].value == 22
    assert any("fused=True" in a or "foreach=True" in a for a in rec.actions)
    assert "optimizer_share" not in rules(advise(make_run(blocks=[blk("optimizer", 10, "step")])))


def test_memory_headroom_needs_capacity():
    gib = 2**30
    metrics = {"memory.peak": (8 * gib, "B"), "memory.activations": (4 * gib, "B")}
    assert "memory_headroom" not in rules(advise(make_run(metrics=metrics)))  # capacity unknown
    run = make_run(device="cuda:0", metrics=metrics, env_extra={"gpu_memory_bytes": 80 * gib})
    rec = rules(advise(run))["memory_headroom"]
    used = {e.key: e.value for e in rec.evidence}["memory.peak / capacity"]
    assert used == pytest.approx(10.0)
    # (0.9 * 80 - 4) / 4 = 17x the batch of 8.
    assert "136" in rec.actions[0]
    full = make_run(device="cuda:0", metrics={"memory.peak": (70 * gib, "B")}, env_extra={"gpu_memory_bytes": 80 * gib})
    assert "memory_headroom" not in rules(advise(full))


def test_noisy_timing():
    noisy = Metric(value=10.0, unit="ms", source="measured", p10=8.0, p90=14.0, n=10)
    quiet = Metric(value=10.0, unit="ms", source="measured", p10=9.8, p90=10.3, n=10)
    rec = rules(advise(make_run(metrics={"step_time": noisy})))["noisy_timing"]
    assert rec.evidence[0].value == pytest.approx(60.0)
    assert "noisy_timing" not in rules(advise(make_run(metrics={"step_time": quiet})))


def test_empty_run_gives_no_advice_and_every_recommendation_has_evidence():
    assert advise(make_run()) == []
    busy = make_run(metrics={"profiler_overhead": (80.0, "%"), "mfu": (5.0, "%")},
                    blocks=[blk("attn.scores", 30), blk("mlp.fc", 50), blk("optimizer", 20, "step")])
    recs = advise(busy, {"sync_idle_pct": 30.0})
    assert len(recs) >= 4
    for r in recs:
        assert r.evidence and all(e.key and e.unit for e in r.evidence)
        assert r.to_dict()["evidence"][0]["key"] == r.evidence[0].key


def test_recompiles_fires_at_one_compilation_per_step_citing_the_reason():
    run = make_run(metrics={"compile.per_step": (1.0, "compilations/step")}, config={"compile": True})
    run.tables["compile"] = [{"phase": "measured", "reason": "tensor 'x' size mismatch at index 1", "function": "forward"}]
    rec = rules(advise(run))["recompiles"]
    assert rec.evidence[0].key == "compile.per_step" and rec.evidence[0].value == 1.0
    assert "size mismatch" in rec.why
    assert advice.RECOMPILES_PER_STEP_MIN == pytest.importorskip("lmprof.measure.compile_events").RECOMPILES_PER_STEP_FLAG


def test_recompiles_silent_when_compiled_once_or_eager():
    assert "recompiles" not in rules(advise(make_run(metrics={"compile.per_step": (0.0, "compilations/step")})))
    assert "recompiles" not in rules(advise(make_run()))
