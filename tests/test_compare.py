"""lmprof compare on runs with hand-chosen figures: ratios, block rows, op/kernel count deltas, refusals."""
from __future__ import annotations

import gzip
import json

import pytest

from lmprof.analysis.compare import compare_runs, count_rows, model_differences, trace_counts
from lmprof.errors import LmprofError
from lmprof.record.run import Block, Env, Metric, OpStat, Run

TINY = {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 65}


def make_run(rid="a", *, mode="train", step_ms=10.0, tps=1000.0, model=None, ops=None, blocks=None,
             extra=None, config=None) -> Run:
    metrics = {
        "step_time": Metric(value=step_ms, unit="ms", source="measured"),
        "tokens_per_s": Metric(value=tps, unit="tokens/s", source="derived"),
        "params": Metric(value=834432, unit="count", source="measured"),
    }
    metrics.update(extra or {})
    cfg = {"preset": "tiny", "batch_size": 8, "model": dict(model or TINY)}
    cfg.update(config or {})
    return Run(
        id=rid, mode=mode, created="2026-01-01T00:00:00Z",
        env=Env(device="cpu", device_name="test", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1),
        config=cfg, metrics=metrics,
        blocks=blocks if blocks is not None else [
            Block(name="attn.qkv", phase="forward", time_ms=step_ms * 0.4, profiled_ms=1, pct=40),
            Block(name="attn.qkv", phase="backward", time_ms=step_ms * 0.6, profiled_ms=1, pct=60)],
        ops=[OpStat(name=n, calls=c, self_ms=1, total_ms=1, self_pct=1) for n, c in (ops or {"aten::mm": 10}).items()],
    )


def test_headline_ratio_is_b_over_a_and_speedup_says_better():
    c = compare_runs([make_run("a", step_ms=10, tps=1000), make_run("b", step_ms=5, tps=2000)])
    rows = {m.key: m for m in c.metrics}
    assert rows["step_time"].ratios == (1.0, 0.5)
    assert rows["step_time"].speedups[1] == pytest.approx(2.0)  # B is 2x faster
    assert rows["tokens_per_s"].ratios == (1.0, 2.0)
    assert rows["tokens_per_s"].speedups[1] == pytest.approx(2.0)
    assert rows["step_time"].higher_is_better is False and rows["tokens_per_s"].higher_is_better is True
    assert c.labels == ("A", "B") and c.run_ids == ("a", "b")


def test_missing_and_na_figures_give_no_ratio():
    b = make_run("b", extra={"mfu": Metric.na("%", "no peak known"), "energy.total": Metric(value=3.0, unit="J", source="measured")})
    c = compare_runs([make_run("a"), b])
    rows = {m.key: m for m in c.metrics}
    assert rows["mfu"].values == (None, None) and rows["mfu"].ratios == (None, None)
    assert rows["mfu"].notes[1] == "no peak known"
    assert rows["energy.total"].values == (None, 3.0) and rows["energy.total"].group == "energy"


def test_op_count_deltas_eager_vs_compiled():
    a = make_run("a", ops={"aten::mm": 10})
    b = make_run("b", ops={"aten::mm": 4, "triton_fused": 2})
    c = compare_runs([a, b])
    ops = {r.name: r for r in c.ops}
    assert ops["aten::mm"].counts == (10, 4) and ops["aten::mm"].deltas == (0, -6) and ops["aten::mm"].change == "changed"
    assert ops["triton_fused"].counts == (0, 2) and ops["triton_fused"].change == "appeared"
    assert c.op_totals == (10, 6)
    assert "top operators" in c.ops_source


def test_count_rows_order_and_disappeared():
    rows = count_rows([{"a": 1, "gone": 3, "same": 2}, {"a": 5, "same": 2, "new": 1}])
    names = [r.name for r in rows]
    assert names == ["new", "gone", "a", "same"]  # appeared, disappeared, changed, same
    assert {r.name: r.change for r in rows} == {"gone": "disappeared", "new": "appeared", "a": "changed", "same": "same"}


def test_blocks_side_by_side_with_absent_blocks():
    a = make_run("a", blocks=[Block(name="attn.scores", phase="forward", time_ms=4, profiled_ms=4, pct=40),
                              Block(name="mlp.fc", phase="forward", time_ms=6, profiled_ms=6, pct=60)])
    b = make_run("b", blocks=[Block(name="attn.sdpa", phase="forward", time_ms=1, profiled_ms=1, pct=25),
                              Block(name="mlp.fc", phase="forward", time_ms=3, profiled_ms=3, pct=75)])
    c = compare_runs([a, b])
    blocks = {(r.name, r.phase): r for r in c.blocks}
    assert blocks[("mlp.fc", "forward")].ratios == (1.0, 0.5)
    assert blocks[("mlp.fc", "forward")].speedups[1] == pytest.approx(2.0)
    assert blocks[("attn.scores", "forward")].times_ms == (4, None)
    assert blocks[("attn.sdpa", "forward")].times_ms == (None, 1)
    (fwd,) = c.phases
    assert fwd.times_ms == (10, 4) and fwd.ratios == (1.0, 0.4)


def test_different_models_refused_unless_forced():
    a, b = make_run("a"), make_run("b", model={**TINY, "n_layer": 12})
    with pytest.raises(LmprofError, match="different models.*n_layer: 4 vs 12.*--force"):
        compare_runs([a, b])
    c = compare_runs([a, b], allow_different_models=True)
    assert any("n_layer" in w for w in c.warnings)


def test_hf_model_vs_builtin_gpt_is_a_different_model():
    hf = make_run("b", config={"hf": "gpt2"})
    assert any(d.startswith("hf:") for d in model_differences(make_run("a"), hf))
    with pytest.raises(LmprofError):
        compare_runs([make_run("a"), hf])


def test_train_vs_infer_refused_unless_forced():
    with pytest.raises(LmprofError, match="train run.*infer run"):
        compare_runs([make_run("a"), make_run("b", mode="infer")])
    c = compare_runs([make_run("a"), make_run("b", mode="infer")], allow_mixed_modes=True)
    assert c.modes == ("train", "infer")


def test_needs_two_runs_and_compares_three():
    with pytest.raises(LmprofError, match="at least two"):
        compare_runs([make_run("a")])
    c = compare_runs([make_run("a", step_ms=10), make_run("b", step_ms=5), make_run("c", step_ms=20)])
    assert {m.key: m for m in c.metrics}["step_time"].ratios == (1.0, 0.5, 2.0)
    assert c.labels == ("A", "B", "C")
    d = c.to_dict()
    assert d["metrics"][0]["speedups"] == [1.0, 2.0, 0.5]


def _write_trace(folder, events) -> None:
    body = {"traceEvents": [dict(ph="X", pid=1, tid=1, dur=1, **e) for e in events]}
    with gzip.open(folder / "trace.json.gz", "wt") as fh:
        json.dump(body, fh)


def _saved(tmp_path, name, run, events):
    folder = tmp_path / name
    run.save(folder)
    run.files["trace"] = "trace.json.gz"
    run.tables["attribution"] = [{"profiled_steps": 2}]
    run.save(folder)
    _write_trace(folder, events)
    return folder


def test_trace_counts_per_step_ops_and_kernels(tmp_path):
    ev_a = [dict(cat="cpu_op", name="aten::mm", ts=i) for i in range(20)] + [
        dict(cat="kernel", name="sgemm", ts=100 + i) for i in range(20)] + [
        dict(cat="user_annotation", name="lmprof:mlp.fc", ts=0)]
    ev_b = [dict(cat="cpu_op", name="aten::mm", ts=i) for i in range(8)] + [
        dict(cat="kernel", name="triton_poi_fused_0", ts=100 + i) for i in range(4)]
    fa = _saved(tmp_path, "a", make_run("a"), ev_a)
    fb = _saved(tmp_path, "b", make_run("b"), ev_b)
    ra, rb = Run.load(fa), Run.load(fb)
    tc = trace_counts(ra)
    assert tc.steps == 2 and tc.ops == {"aten::mm": 10} and tc.kernels == {"sgemm": 10}
    c = compare_runs([ra, rb], trace_counts=[trace_counts(ra), trace_counts(rb)])
    assert "trace" in c.ops_source
    kernels = {k.name: k for k in c.kernels}
    assert kernels["sgemm"].change == "disappeared" and kernels["triton_poi_fused_0"].counts == (0, 2)
    assert c.kernel_totals == (10, 2)


def test_cli_compare_tables_json_and_errors(tmp_path, cli):
    fa = tmp_path / "a"
    fb = tmp_path / "b"
    make_run("a", step_ms=10, tps=1000).save(fa)
    make_run("b", step_ms=5, tps=2000, ops={"aten::mm": 4, "triton_fused": 2}).save(fb)
    code, out, err = cli("compare", fa, fb)
    assert code == 0, err
    assert "step_time" in out and "0.50x" in out and "2.00x better" in out and "triton_fused" in out
    code, out, _ = cli("compare", fa, fb, "--json")
    assert code == 0 and json.loads(out)["metrics"][0]["ratios"] == [1.0, 0.5]
    other = tmp_path / "c"
    make_run("c", model={**TINY, "n_embd": 256}).save(other)
    code, _, err = cli("compare", fa, other)
    assert code == 2 and err.count("\n") == 1 and "different models" in err
    assert cli("compare", fa, other, "--force")[0] == 0
    code, _, err = cli("compare", fa, tmp_path / "missing")
    assert code == 2 and "no run record" in err


def test_blocks_show_ops_per_step_before_and_after(tmp_path, cli):
    """Eager (A) vs compiled (B): per block, time and operators/kernels per step side by side; the
    phase total adds the blocks' counts; a run without the column shows none (None)."""
    def blocks(qkv_ms, act_ms, qkv_ops, act_ops):
        return [Block(name="attn.qkv", phase="forward", time_ms=qkv_ms, profiled_ms=1, pct=50, ops=qkv_ops),
                Block(name="mlp.act", phase="forward", time_ms=act_ms, profiled_ms=1, pct=50, ops=act_ops)]

    a = make_run("a", blocks=blocks(4.0, 2.0, 7, 1))
    b = make_run("b", blocks=blocks(3.0, 0.5, 2, 1), config={"compile": True})
    c = compare_runs([a, b])
    rows = {(r.name, r.phase): r for r in c.blocks}
    assert rows[("attn.qkv", "forward")].ops == (7, 2) and rows[("attn.qkv", "forward")].times_ms == (4.0, 3.0)
    assert rows[("mlp.act", "forward")].ops == (1, 1)
    assert c.phases[0].ops == (8, 3) and c.phases[0].times_ms == (6.0, 3.5)
    old = make_run("old")  # a record from before the column: no ops
    assert compare_runs([old, b]).phases[0].ops == (None, 3)
    fa, fb = tmp_path / "a", tmp_path / "b"
    a.save(fa)
    b.save(fb)
    code, out, _ = cli("compare", fa, fb, "--no-trace")
    assert code == 0 and "A ops" in out and "B ops" in out
    line = next(ln for ln in out.splitlines() if "attn.qkv" in ln and "forward" in ln)
    assert [x for x in line.split() if x != "│"][-2:] == ["7", "2"]


def test_step_time_in_seconds_is_converted_not_read_as_ms(tmp_path, cli):
    """Issue 29 item 11: B writes step_time in s (0.005 s = 5 ms); the ratio is 0.5, not 0.0005."""
    b = make_run("b", extra={"step_time": Metric(value=0.005, unit="s", source="measured",),
                             "memory.peak": Metric(value=1.0, unit="MiB", source="measured")})
    a = make_run("a", extra={"memory.peak": Metric(value=2.0**21, unit="B", source="measured")})
    rows = {m.key: m for m in compare_runs([a, b]).metrics}
    assert rows["step_time"].unit == "ms" and rows["step_time"].values == (10.0, pytest.approx(5.0))
    assert rows["step_time"].ratios[1] == pytest.approx(0.5)
    assert rows["memory.peak"].values == (2.0**21, 2.0**20)
    fa, fb = tmp_path / "a", tmp_path / "b"
    a.save(fa)
    b.save(fb)
    code, out, err = cli("compare", fa, fb, "--no-trace")
    assert code == 0, err
    assert "2.00x better" in out


def test_units_without_a_conversion_are_refused_in_one_line(tmp_path, cli):
    b = make_run("b", extra={"step_time": Metric(value=5.0, unit="tokens", source="measured")})
    with pytest.raises(LmprofError, match="step_time.*'tokens'.*'ms'|step_time.*'ms'.*'tokens'"):
        compare_runs([make_run("a"), b])
    fa, fb = tmp_path / "a", tmp_path / "b"
    make_run("a").save(fa)
    b.save(fb)
    code, _, err = cli("compare", fa, fb, "--no-trace")
    assert code == 2 and err.count("\n") == 1 and "step_time" in err and "Traceback" not in err


def test_unknown_schema_version_is_refused(tmp_path, cli):
    fa, fb = tmp_path / "a", tmp_path / "b"
    make_run("a").save(fa)
    make_run("b").save(fb)
    raw = json.loads((fb / "run.json").read_text())
    raw["schema"] = "lmprof.run/2"
    (fb / "run.json").write_text(json.dumps(raw))
    code, _, err = cli("compare", fa, fb, "--no-trace")
    assert code == 2 and err.count("\n") == 1 and "lmprof.run/2" in err and "lmprof.run/1" in err
