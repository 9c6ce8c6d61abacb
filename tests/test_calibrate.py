"""Calibration (tiny sizes, a temporary cache) and resolve_peak's table > calibration > n/a order."""
from __future__ import annotations

import json

import pytest

from lmprof.hardware.cpu_load import OtherLoad

from lmprof.cli.main import main
from lmprof.errors import ConfigError
from lmprof.hardware.calibrate import (
    SCHEMA,
    Calibration,
    cache_path,
    calibrate,
    load_calibration,
    resolve_peak,
    save_calibration,
)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("LMPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LMPROF_PEAKS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    # A quiet machine, injected: on a shared machine real repeats and load would (rightly) get a
    # calibration refused (tests/test_calibrate_disturbed.py); the matmuls and copies still run once.
    from lmprof.hardware import calibrate as cal_mod

    def steady(fn, sync, budget_s, max_samples=200):
        fn()
        return [1e-3, 1e-3, 1e-3]

    monkeypatch.setattr("lmprof.hardware.ceilings._timed", steady)
    monkeypatch.setattr(cal_mod, "_loadavg", lambda: 0.0)
    monkeypatch.setattr("lmprof.hardware.cpu_load.other_load", lambda before, after, kind: OtherLoad(0.0, 0.02, 1.0, 0.01, 1, 2))
    return tmp_path / "cache"


def fake(device_name: str, kind: str, flops: dict[str, float], bw: float | None) -> Calibration:
    cal = Calibration(device=kind, device_name=device_name, hostname=__import__("socket").gethostname(),
                      created="2025-01-01T00:00:00+00:00", torch="x", threads=1, seconds=1.0)
    cal.matmul = {dt: {"flops_per_s": f, "size": 64, "n": 3, "by_size": {}} for dt, f in flops.items()}
    cal.bandwidth = {} if bw is None else {"bytes_per_s": bw, "nbytes": 1, "method": "copy", "n": 3}
    return cal


def test_calibrate_writes_cache(isolated):
    cal = calibrate("cpu", ["fp32"], seconds=0.3, sizes=[32, 64], copy_bytes=2**20)
    assert cal.path and cal.path.startswith(str(isolated))
    data = json.loads(open(cal.path).read())
    assert data["schema"] == SCHEMA and data["device"] == "cpu"
    assert data["matmul"]["fp32"]["flops_per_s"] > 0 and data["matmul"]["fp32"]["size"] in (32, 64)
    assert data["bandwidth"]["bytes_per_s"] > 0 and data["bandwidth"]["nbytes"] == 2**20
    again = load_calibration(cal.device_name, "cpu")
    assert again is not None and again.flops_for("fp32") == cal.flops_for("fp32")
    peak = resolve_peak(cal.device_name, "cpu", "fp32")
    assert peak.flops_per_s == cal.flops_for("fp32")
    assert peak.source == f"calibrated:{cal.path}"
    assert "not a datasheet peak" in peak.note


def test_table_is_preferred_over_calibration(isolated):
    save_calibration(fake("NVIDIA H100 80GB HBM3", "cuda", {"bf16": 1e12}, 1e12), isolated)
    peak = resolve_peak("NVIDIA H100 80GB HBM3", "cuda", "bf16")
    assert peak.source == "table:h100-sxm"
    assert peak.flops_per_s == pytest.approx(989.4e12) and peak.bytes_per_s == 3.35e12
    assert peak.ridge == pytest.approx(989.4e12 / 3.35e12)


def test_calibration_fills_a_dtype_the_table_lacks(isolated):
    save_calibration(fake("Tesla V100-SXM2-16GB", "cuda", {"bf16": 20e12}, None), isolated)
    peak = resolve_peak("Tesla V100-SXM2-16GB", "cuda", "bf16")
    assert peak.flops_per_s == 20e12 and peak.source.startswith("calibrated:")
    assert peak.bytes_per_s == 900e9 and peak.bytes_source == "table:v100-sxm2"


def test_unknown_device_is_na_with_reason(isolated):
    peak = resolve_peak("Some Unknown GPU", "cuda", "bf16")
    assert peak.flops_per_s is None and peak.bytes_per_s is None and peak.source is None
    assert "lmprof calibrate" in peak.note and not peak.available
    # a table device without that dtype and no calibration: n/a FLOP/s, bandwidth still known
    v100 = resolve_peak("v100", None, "bf16")
    assert v100.flops_per_s is None and v100.bytes_per_s == 900e9 and "no bf16" in v100.note


def test_cache_path_names_host_and_device(isolated):
    p = cache_path("NVIDIA H100 80GB HBM3", "cuda", hostname="Node-1")
    assert p.parent == isolated and p.name == "calibration-node-1-cuda-nvidia-h100-80gb-hbm3.json"


def test_unsupported_dtypes():
    with pytest.raises(ConfigError):
        calibrate("cpu", ["tf32"], seconds=0.1, sizes=[16], copy_bytes=2**16, save=False)
    with pytest.raises(ConfigError):
        calibrate("cpu", [], seconds=0.1, save=False)


def test_cli(capsys, isolated):
    code = main(["calibrate", "--seconds", "0.3", "--sizes", "32,64", "--dtypes", "fp32"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "fp32 matmul" in out and "GFLOP/s" in out and "GB/s" in out and "saved" in out
    assert list(isolated.glob("calibration-*.json"))


@pytest.mark.parametrize(
    "args", [["--dtypes", "fp99"], ["--seconds", "-1"], ["--sizes", "a,b"], ["--device", "tpu"], ["--dtypes", "tf32"]]
)
def test_cli_bad_input(capsys, args):
    assert main(["calibrate", "--sizes", "16", "--seconds", "0.1", "--no-save", *args]) == 2
    assert "lmprof: error:" in capsys.readouterr().err


def test_cli_if_missing_calibrates_once(capsys, isolated):
    assert main(["calibrate", "--if-missing", "--seconds", "0.3", "--sizes", "32", "--dtypes", "fp32"]) == 0
    first = capsys.readouterr().out
    assert "saved" in first
    assert main(["calibrate", "--if-missing", "--seconds", "0.3", "--sizes", "32", "--dtypes", "fp32"]) == 0
    assert "already cached" in capsys.readouterr().out


def test_a_cpu_calibration_is_used_only_with_its_thread_count(isolated):
    """Issue 13 §5: a 1-thread run against a 2-thread calibration reported MFU 28% instead of ~57%."""
    cal = fake("Some CPU", "cpu", {"fp32": 100e9}, 40e9)
    cal.threads = 2
    save_calibration(cal, isolated)
    two = resolve_peak("Some CPU", "cpu", "fp32", threads=2)
    assert two.flops_per_s == 100e9
    one = resolve_peak("Some CPU", "cpu", "fp32", threads=1)
    assert one.flops_per_s is None and "taken with 2 thread(s) and this run uses 1" in one.note


def test_the_hardware_package_has_no_import_circle():
    """Issue 49, item 10: calibrate imported quick_bandwidth (inside resolve_peak) and quick_bandwidth
    imported calibrate. Every import of lmprof.hardware modules, at the top or inside a function, read
    from the source: the graph they make has no cycle."""
    import ast
    from pathlib import Path

    import lmprof.hardware as hw

    folder = Path(hw.__file__).parent
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        edges = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "lmprof.hardware":
                    edges |= {a.name for a in node.names if a.name in names}
                elif node.module.startswith("lmprof.hardware."):
                    edges.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                edges |= {a.name.split(".")[2] for a in node.names if a.name.startswith("lmprof.hardware.")}
        graph[name] = edges - {name}

    def cycle_from(start: str, path: list[str]) -> list[str] | None:
        for nxt in graph.get(path[-1], ()):
            if nxt == start:
                return [*path, nxt]
            if nxt not in path:
                found = cycle_from(start, [*path, nxt])
                if found:
                    return found
        return None

    assert "quick_bandwidth" in graph["resolve"]  # the graph is read, not empty
    for name in graph:
        assert cycle_from(name, [name]) is None, " -> ".join(cycle_from(name, [name]) or [])
