"""The metric catalogue against what lmprof really writes.

Three tiny runs (``lmprof train`` with an energy estimate, ``lmprof infer``, ``lmprof run`` of a plain
PyTorch script lmprof has no formulas for) are read back with the json module, not lmprof's loader:
every figure in them must be in the catalogue with the same unit and a source kind the catalogue
allows, and every catalogue entry must be written by one of them or say when it is written. The
figures those runs cannot reach (distributed, compiled, a readable energy meter) are checked from the
code that writes them, fed by hand.
"""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lmprof.cli.main import main
from lmprof.record.catalogue import CATALOGUE, DOC_PATH, lookup, markdown, ranked

ROOT = Path(__file__).resolve().parents[1]

# A training script with a model lmprof has no formulas for: FLOPs are counted, memory measured only.
SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 100))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i in range(10):
    x = torch.randint(0, 100, (2, 16))
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
FAST = ("--steps", "2", "--warmup", "2", "--profile-steps", "1", "--no-report")


def _record(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "run.json").read_text())
    return data


def _check(where: str, mode: str, metrics: dict[str, Any]) -> None:
    """Every figure is catalogued with this unit, a kind the catalogue allows, and this mode."""
    for key, m in metrics.items():
        spec = lookup(key)
        assert spec is not None, f"{where}: {key} is not in the catalogue"
        assert m["unit"] == spec.unit, (where, key, m["unit"], spec.unit)
        assert m["source"] in spec.sources, (where, key, m["source"], spec.sources)
        assert mode in spec.modes, (where, key, mode, spec.modes)
        if spec.spread and m["value"] is not None:
            assert m["n"] and m["p10"] is not None and m["p90"] is not None, (where, key)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The run folder of each of the three tiny runs."""
    base = tmp_path_factory.mktemp("catalogue")
    script = base / "plain_train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    argv = {
        "train": ["train", "--preset", "tiny", "--batch-size", "2", "--seq-len", "16", "--device", "cpu",
                  "--no-plots", "--energy", "estimate", "--tdp-w", "10", *FAST],
        "infer": ["infer", "--preset", "tiny", "-n", "3", "--prompt-len", "8", "--device", "cpu", "--no-plots", *FAST],
        "run": ["run", *FAST, str(script)],
    }
    out = {}
    for name, args in argv.items():
        assert main([args[0], "--out", str(base / name), *args[1:]]) == 0, name
        found = sorted((base / name).glob("*/run.json"))
        assert len(found) == 1, found
        out[name] = found[0].parent
    return out


@pytest.fixture(scope="module")
def records(folders: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """run.json of each of the three tiny runs, as plain JSON."""
    return {name: _record(folder) for name, folder in folders.items()}


@pytest.mark.slow
def test_every_written_figure_is_catalogued_with_its_unit_and_kind(records: dict[str, dict[str, Any]]) -> None:
    for name, rec in records.items():
        assert rec["metrics"], name
        _check(name, rec["mode"], rec["metrics"])


@pytest.mark.slow
def test_figures_the_tiny_runs_cannot_reach(folders: dict[str, Path], tmp_path: Path) -> None:
    """Distributed, compiled and metered figures, from the code that writes them, fed by hand."""
    from lmprof.measure.compile_events import CompileEvent, CompileReport
    from lmprof.measure.energy import energy_metrics
    from lmprof.measure.energy.base import EnergyWindow
    from lmprof.measure.energy.monitor import DomainEnergy, EnergyResult
    from lmprof.pipeline.distributed import assemble

    # Two ranks: the tiny train (or infer) run twice, merged the way rank 0 merges a torchrun job.
    for name in ("train", "infer"):
        job = tmp_path / name
        for rank in (0, 1):
            (job / f"rank{rank}").mkdir(parents=True)
            shutil.copy(folders[name] / "run.json", job / f"rank{rank}" / "run.json")
        assemble(job, 2)
        rec = _record(job)
        _check(f"distributed {name}", rec["mode"], rec["metrics"])
        assert {"world_size", "slowest_rank", "straggler"} <= set(rec["metrics"])
        assert ("tokens_per_s.global" if name == "train" else "decode_tokens_per_s.global") in rec["metrics"]

    # A compiled run: one compilation in warm-up, a recompilation in the measured window of 3 steps.
    events = [CompileEvent("0/0", "compile", "warm-up", "forward", "m.py:1", "", False, 0.5),
              CompileEvent("0/1", "recompile", "measured", "forward", "m.py:1", "guard failed", True, 0.2)]
    report = CompileReport(events, {"measured": 3}, 0.9, {})
    compiled = {k: m.model_dump() for k, m in report.metrics().items()}
    assert {"compile.per_step", "compile.time", "compile.recompiles"} <= set(compiled)
    _check("compile", "train", compiled)
    _check("compile", "infer", compiled)

    # A readable meter (one RAPL domain, 10 J over 2 s, 1 W idle), with the units each mode gives it
    # (pipeline/protocol/finish/figures.py: steps and tokens in training, generations and generated tokens in inference).
    result = EnergyResult(mode="auto", seconds=2.0, idle_seconds=1.0, domains=[DomainEnergy(
        "cpu", "rapl", "counter", "measured", True, 0.001, window=EnergyWindow(10.0, 2.0, "counter"), idle_w=1.0)])
    for mode in ("train", "infer"):
        metered = {k: m.model_dump() for k, m in energy_metrics(result, steps=4, tokens=64, flops=1e9, mode=mode).items()}
        assert len(metered) >= 9, metered
        _check(f"energy {mode}", mode, metered)


@pytest.mark.slow
def test_every_entry_is_written_or_says_when(records: dict[str, dict[str, Any]]) -> None:
    written = {lookup(k).name for rec in records.values() for k in rec["metrics"]}  # type: ignore[union-attr]
    for spec in CATALOGUE:
        assert spec.name in written or spec.condition, f"{spec.name}: no run wrote it and no condition says when"


@pytest.mark.slow
def test_the_runs_write_what_their_mode_always_writes(records: dict[str, dict[str, Any]]) -> None:
    # An entry without a condition is written by every run of its modes; lmprof's own workloads (train,
    # infer) also write every figure that only lmprof run may lack.
    for name in ("train", "infer"):
        rec = records[name]
        for spec in CATALOGUE:
            always = spec.condition is None or spec.condition.startswith("lmprof run:")
            if rec["mode"] in spec.modes and not spec.family and always:
                assert spec.name in rec["metrics"], (name, spec.name)
    # --energy estimate writes the estimated family, each figure as estimated.
    est = {k: m for k, m in records["train"]["metrics"].items() if k.startswith("energy.estimated.")}
    assert {"energy.estimated.total", "energy.estimated.per_token", "energy.estimated.per_step"} <= set(est)
    assert {m["source"] for m in est.values()} == {"estimated"}
    # The plain script's FLOPs were counted, not estimated: the catalogue's second kind.
    run = records["run"]["metrics"]
    assert run["flops.model_per_step"]["source"] == "measured"
    assert run["mbu"]["value"] is None


def test_families_and_unknown_keys() -> None:
    assert lookup("energy.domain.gpu:0").name == "energy.domain.<domain>"  # type: ignore[union-attr]
    assert lookup("energy.estimated.domain.cpu").name == "energy.estimated.domain.<domain>"  # type: ignore[union-attr]
    assert lookup("energy.domain.") is None and lookup("no.such.figure") is None
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names))


def test_views_read_the_catalogue() -> None:
    from lmprof.analysis.compare import HEADLINE_KEYS, higher_is_better
    from lmprof.record.store import VIEW_METRICS, metric_column
    from lmprof.show.run_report import HEADLINE
    from lmprof.show.summary import HEADLINE as SUMMARY

    assert SUMMARY[:4] == ("step_time", "tokens_per_s", "ttft", "tpot")
    assert HEADLINE_KEYS[:4] == ("step_time", "tokens_per_s", "profiled_step_time", "profiler_overhead")
    train_cards = [slot[0].name for slot in HEADLINE["train"]]
    assert train_cards == ["step_time", "tokens_per_s", "mfu", "memory.peak", "energy.per_token",
                           "profiler_overhead", "loss"]
    infer_cards = [slot[0].name for slot in HEADLINE["infer"]]
    assert infer_cards == ["ttft", "tpot", "decode_tokens_per_s", "e2e_latency", "prefill.mfu", "decode.mbu",
                           "memory.peak", "kv_cache", "energy.per_generated_token", "profiler_overhead"]
    # The results view's columns, written out by hand: what sweeps already on disk expose.
    assert [metric_column(k, u) for k, u in VIEW_METRICS] == [
        "step_time_ms", "tokens_per_s", "ttft_ms", "tpot_ms", "decode_tokens_per_s", "e2e_latency_ms", "params",
        "loss", "mfu_pct", "memory_peak_bytes", "energy_per_token_j", "energy_flop_per_joule", "noisy"]
    assert [m.name for m in ranked("view")] == [k for k, _ in VIEW_METRICS]
    # Directions: throughputs and utilisations up, times and bytes down, device peaks neither.
    assert higher_is_better("decode.mfu", "%") is True and higher_is_better("ttft", "ms") is False
    assert higher_is_better("peak.flops", "FLOP/s") is None and higher_is_better("memory.peak", "B") is False
    assert higher_is_better("some.future_rate", "tokens/s") is True  # unknown: by its unit


def test_checked_in_doc_is_the_generated_one() -> None:
    doc = ROOT / DOC_PATH
    assert doc.read_text(encoding="utf-8") == markdown(), (
        "docs/metrics.md is stale: run `python -m lmprof.record.catalogue --write`")
    for spec in CATALOGUE:
        assert f"`{spec.name}`" in markdown()
    assert "docs/metrics.md" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "metrics.md" in (ROOT / "docs" / "run-format.md").read_text(encoding="utf-8")


def _named_keys() -> set[str]:
    """Every figure name the catalogue gives a writer: its name constants (an upper-case name whose value
    is a dotted lower-case key, not a condition's words) and what its key builders make."""
    import re

    from lmprof.names import PASS_PHASES
    from lmprof.record import catalogue as cat

    named = {v for k, v in vars(cat).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z0-9_.]+", v)}
    named |= {cat.cost_key(p, k) for p in PASS_PHASES for k in cat.COSTS}
    named |= {cat.memory_key(p, e) for p in cat.MEMORY_PARTS for e in (False, True)}
    named |= {cat.energy_key(p, e) for p in (*cat.ENERGY_PARTS, "domain.<domain>") for e in (False, True)
              if (p, e) != ("window", True)}  # an estimate has no metered window
    named |= {cat.global_key(k) for k in (cat.TOKENS_PER_S, cat.DECODE_TOKENS_PER_S)}
    return named


def test_every_key_a_writer_takes_is_catalogued_and_every_figure_has_one() -> None:
    from lmprof.record import catalogue as cat

    named, catalogued = _named_keys(), {m.name for m in CATALOGUE}
    assert named - catalogued == set(), "name constants the catalogue's table does not declare"
    assert catalogued - named == set(), "catalogue entries with no name constant or key builder"
    for bad in (lambda: cat.memory_key("weights"), lambda: cat.energy_key("per_decode_step"),
                lambda: cat.energy_key("domain."), lambda: cat.cost_key("eval", cat.MFU)):
        with pytest.raises(KeyError):
            bad()


# Where a metric's name stands as a key: metrics[...], metrics.get/pop(...), run.value/metric(...),
# Evidence(...), {...: Metric(...)}.
_KEY_CALLS = {"value", "metric", "Evidence"}


def _spelled_keys(tree: Any) -> list[tuple[int, str]]:
    import ast

    def metric_name(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and lookup(node.value) is not None:
            return node.value
        return None

    found = []
    for node in ast.walk(tree):
        hits: list[ast.AST | None] = []
        if isinstance(node, ast.Subscript) and "metric" in ast.unparse(node.value):
            hits.append(node.slice)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            on_metrics = isinstance(func, ast.Attribute) and "metric" in ast.unparse(func.value)
            if name in _KEY_CALLS or (on_metrics and name in ("get", "pop", "setdefault")):
                hits.append(node.args[0] if node.args else None)
        elif isinstance(node, ast.Dict):
            hits += [k for k, v in zip(node.keys, node.values)
                     if isinstance(v, ast.Call) and "Metric" in ast.unparse(v.func)]
        found += [(node.lineno, name) for name in map(metric_name, hits) if name]
    return found


def test_writers_take_metric_keys_from_the_catalogue() -> None:
    """No module spells a figure's name where it stands as a metrics key: it takes the name from the
    catalogue's constants and key builders, so a typo cannot write a figure no reader knows."""
    import ast

    assert [name for _, name in _spelled_keys(ast.parse(
        'run.metrics["step_time"] = Metric(value=1)\nrun.value("prefill.mfu")\nm = {"ttft": Metric.na("ms", "")}\n'
        'metrics.get("memory.peak")\nrun.metrics[STEP_TIME]\nrun.value("not.a.figure")'))] == [
        "step_time", "prefill.mfu", "ttft", "memory.peak"]  # the scan finds what it looks for
    src = ROOT / "src" / "lmprof"
    spelled = [f"{path.relative_to(src)}:{line}: {name}"
               for path in sorted(src.rglob("*.py")) if path.relative_to(src).as_posix() != "record/catalogue.py"
               for line, name in _spelled_keys(ast.parse(path.read_text(encoding="utf-8")))]
    assert spelled == []
