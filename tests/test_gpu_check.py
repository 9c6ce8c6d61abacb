"""scripts/gpu_check.py, the one-shot CUDA check (issue 51), kept from rotting without a GPU: its plan,
its summary schema and bundle layout, a failing step recorded while the check goes on, the budget,
bad --out folders, the markdown for docs/gpu-validation.md, and the OOM bisection on a fake device.
Nothing here imports torch or runs lmprof: each subprocess is a bare Python."""
from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _module(name: str) -> ModuleType:
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))  # gpu_check imports gpu_check_summary from beside it
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


drv = _module("gpu_check")
summary = _module("gpu_check_summary")


def _driver(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})


def test_plan_lists_every_step_and_writes_a_valid_summary_and_bundle(tmp_path):
    out, bundle = tmp_path / "out dir [x]", tmp_path / "bundle"
    p = _driver("--plan", "--out", str(out), "--bundle", str(bundle))
    assert p.returncode == 0, p.stderr
    names = [s.name for s in drv.STEPS]
    assert [line.split()[1] for line in p.stdout.splitlines()] == names
    d = json.loads((out / "summary.json").read_text())
    assert drv.validate_summary(d) == []
    assert {s["status"] for s in d["steps"]} == {"planned"} and d["counts"]["planned"] == len(names)
    # what the device tool brings back: at most 8 flat files named in letters, digits, '.', '_', '-'
    files = sorted(p.name for p in bundle.iterdir())
    assert files == ["results.tar.gz", "summary.json", "summary.md"]
    assert all(drv.bundle_name_ok(f) for f in files) and all((bundle / f).is_file() for f in files)
    md = (out / "summary.md").read_text()
    assert md == summary.markdown(d) and md.startswith("## ") and "### train_compiled" in md
    # the schema check catches what a broken driver would write
    bad = json.loads(json.dumps(d))
    bad["steps"][1]["status"] = "error"
    bad["steps"][2]["figures"] = [{"name": "x", "value": 1}]
    bad["steps"] = bad["steps"][::-1]
    errors = drv.validate_summary(bad)
    assert any("in order" in e for e in errors) and any("without a reason" in e for e in errors)
    assert any("figure 'x' malformed" in e for e in errors)


def test_a_failing_step_is_recorded_and_the_check_goes_on(tmp_path):
    fake = f"{sys.executable} -c 'import sys; print(\"boom\", file=sys.stderr); sys.exit(3)'"
    p = _driver("--device", "cpu", "--out", str(tmp_path / "o"), "--only", "train_compiled,infer_lesson,energy",
                "--lmprof-cmd", fake, "--budget", "200")
    assert p.returncode == 1, p.stderr
    d = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert drv.validate_summary(d) == []
    by = {s["name"]: s for s in d["steps"]}
    for name in ("train_compiled", "infer_lesson"):
        assert by[name]["status"] == "error" and by[name]["reason"] == "exit 3: boom"
        cmd = by[name]["commands"][0]
        assert cmd["rc"] == 3 and "boom" in cmd["stderr_tail"] and (tmp_path / "o" / cmd["stderr"]).is_file()
    assert by["energy"]["reason"] == "needs CUDA"
    assert by["env"]["reason"].startswith("not selected")
    assert d["counts"] == {"planned": 0, "pass": 0, "fail": 0, "error": 2, "timeout": 0, "skipped": 10}


def test_steps_the_budget_cannot_fit_are_skipped_with_the_reason(tmp_path):
    p = _driver("--device", "cpu", "--out", str(tmp_path / "o"), "--skip", "env", "--budget", "30",
                "--lmprof-cmd", "false")
    d = json.loads((tmp_path / "o" / "summary.json").read_text())
    reasons = {s["name"]: s["reason"] for s in d["steps"]}
    assert p.returncode == 0 and d["counts"]["skipped"] == len(drv.STEPS)
    assert reasons["train_compiled"].startswith("budget: ") and "needs 90 s" in reasons["train_compiled"]


def test_bad_out_folders_get_one_line_and_exit_2(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    for out in (a_file, busy):
        assert drv.main(["--plan", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not an empty folder" in err
    assert (busy / "mine.txt").read_text() == "keep" and a_file.read_text() == "x"
    assert drv.main(["--plan", "--out", str(a_file / "sub")]) == 2
    assert "cannot create" in capsys.readouterr().err


def test_summary_markdown_and_its_bad_input(tmp_path, capsys):
    rec = drv.StepRecord("train_compiled", "t", False, "fail", reason="MFU", wall_s=12.5)
    rec.figures.append(drv.Figure("mfu", 43.21, "%", "derived", "a | b"))
    rec.checks.append(drv.Check("MFU", 38.0, "%", ">= 40 %", False, ""))
    d = {"schema": drv.SCHEMA, "created": "2026-12-01T00:00:00+00:00", "mode": "run", "device": "cuda",
         "budget_s": 540.0, "wall_s": 300.0, "setup": {"seconds": "12.0"},
         "env": {"device_name": "NVIDIA H200", "capability": "9.0", "driver": "580.1", "torch": "2.11.0"},
         "counts": {}, "steps": []}
    d["steps"] = [drv.asdict(drv.StepRecord(s.name, s.title, s.needs_cuda, "skipped", "needs CUDA")) for s in drv.STEPS]
    d["steps"][1] = drv.asdict(rec)
    d["counts"] = {"fail": 1, "skipped": len(drv.STEPS) - 1}
    assert drv.validate_summary(d) == []
    md = summary.markdown(d)
    assert "## 2026-12-01 — NVIDIA H200" in md and "capability 9.0" in md and "580.1" in md
    assert "| MFU | 38 % | >= 40 % | **FAIL** |" in md and "| mfu | 43.21 | % | derived | a \\| b |" in md
    assert "Not run: env (needs CUDA)" in md
    (tmp_path / "summary.json").write_text(json.dumps(d))
    assert summary.main([str(tmp_path)]) == 0 and capsys.readouterr().out == md
    (tmp_path / "summary.json").write_text('{"schema": "other"}')
    assert summary.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert summary.main([str(tmp_path / "missing.json")]) == 2


def test_oom_bisection_on_a_fake_device():
    oom = _module("gpu_oom_boundary")

    def device(limit):
        tried = []

        def fits(b):
            tried.append(b)
            return b <= limit

        return fits, tried

    for start in (1, 100, 131, 400):
        fits, tried = device(137)
        assert oom.bisect_boundary(fits, start, lambda: 1.0) == (137, 138)
        assert len(tried) <= 20 and len(set(tried)) == len(tried)  # no batch probed twice
    fits, _ = device(0)
    assert oom.bisect_boundary(fits, 50, lambda: 1.0) == (None, 1)  # not even one sequence fits
    fits, _ = device(10**9)
    assert oom.bisect_boundary(fits, 50, lambda: 1.0, cap=64) == (64, None)  # the cap fits: no boundary below it
    fits, tried = device(137)
    assert oom.bisect_boundary(fits, 131, lambda: 0.0) == (None, None) and tried == []  # no time: no probe


def test_hand_flops_and_card_peaks():
    # GPT-2 124M: N = 123,653,376 non-embedding parameters (docs/flops-and-roofline.md), B=1, T=1
    gpt2 = {"n_layer": 12, "n_embd": 768, "vocab_size": 50257}
    assert drv.hand_model_flops(gpt2, 1, 1) == 6 * 123_653_376 + 12 * 12 * 768
    assert drv.card_peak("NVIDIA H100 PCIe") == 756e12 and drv.card_peak("NVIDIA H200") == 989.4e12
    assert drv.card_peak("NVIDIA H100 80GB HBM3") == 989.4e12 and drv.card_peak("Tesla T4") is None


def test_trace_counts_on_a_trace_written_event_by_event(tmp_path):
    def ev(cat, name, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}

    events = [
        ev("cpu_op", "aten::addmm", 5, 1),  # the profiler's warm-up step: outside every ProfilerStep
        ev("cuda_runtime", "cudaLaunchKernel", 6, 1, correlation=1), ev("kernel", "warm", 50, 7, correlation=1),
        ev("user_annotation", "ProfilerStep#1", 100, 100), ev("user_annotation", "ProfilerStep#2", 200, 100),
        ev("cpu_op", "aten::addmm", 110, 5), ev("cpu_op", "aten::addmm", 210, 5), ev("cpu_op", "aten::mm", 220, 5),
        ev("cuda_runtime", "cudaLaunchKernel", 111, 2, correlation=2), ev("kernel", "gemm", 150, 30, correlation=2),
        ev("cuda_runtime", "cudaMemcpyAsync", 211, 2, correlation=3), ev("gpu_memcpy", "Memcpy DtoD", 300, 4, correlation=3),
        ev("cuda_runtime", "cudaGraphLaunch", 230, 2, correlation=4),
        ev("kernel", "ncclDevKernel_AllReduce", 310, 6, correlation=4), ev("kernel", "", 320, 1, correlation=9),
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    c = drv.trace_counts(path)
    assert c["ops"] == {"aten::addmm": 2, "aten::mm": 1} and c["profiler_steps"] == 2
    assert (c["kernels"], c["device_events"], c["kernels_unnamed"], c["nccl_kernels"], c["graph_launches"]) == (4, 5, 1, 1, 1)
    # launched inside the steps: gemm 30 + memcpy 4 + the graph's all-reduce 6 (the warm-up kernel and the
    # kernel with no launch are out), over 2 steps, in ms
    assert c["device_ms_per_step"] == (30 + 4 + 6) / 1e3 / 2


def test_a_closed_stdout_does_not_stop_the_check(tmp_path):
    # `bash scripts/gpu_check.sh | head -3` closed the pipe: the first progress line after it raised
    # BrokenPipeError and the check died without its summary
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "gpu_check.py"), "--device", "cpu", "--out", str(tmp_path / "o"),
                             "--only", "infer_lesson,train_eager", "--lmprof-cmd", "false"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None
    proc.stdout.close()
    proc.wait(timeout=60)
    d = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert [s["status"] for s in d["steps"] if s["name"] in ("infer_lesson", "train_eager")] == ["error", "error"]
