"""Compilations, recompilations and graph breaks, read from dynamo's records, against known truths.

The truths are in this file: the line of a deliberate graph break, and a shape we change on purpose.
backend="eager" keeps these fast: dynamo records the same events whatever backend compiles the graph.
"""
from __future__ import annotations

import inspect

import pytest
import torch

from lmprof.measure.compile_events import MEASURED, CompileWatch, short_reason

pytestmark = pytest.mark.slow


def _breaks(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    torch._dynamo.graph_break()  # BREAK_HERE
    return y.cos()


def _break_line() -> int:
    lines, first = inspect.getsourcelines(_breaks)
    return first + next(i for i, ln in enumerate(lines) if "BREAK_HERE" in ln)


def test_a_deliberate_graph_break_is_reported_with_its_reason_and_line():
    torch._dynamo.reset()
    watch = CompileWatch.start()
    torch.compile(_breaks, backend="eager")(torch.randn(3))
    report = watch.finish()
    sites = report.graph_break_sites
    assert len(sites) == 1
    where, reason = sites[0]
    assert where == f"{__file__}:{_break_line()}"
    assert "graph_break" in reason.lower() or "graph break" in reason.lower()
    assert report.metrics()["compile.graph_breaks"].value == 1
    assert any("graph break at" in n for n in report.notes())


def _plain(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).relu()


def test_a_shape_change_forces_a_recompilation_reported_with_the_guard_that_failed():
    torch._dynamo.reset()
    watch = CompileWatch.start()
    f = torch.compile(_plain, backend="eager", dynamic=False)
    f(torch.randn(4))
    f(torch.randn(4))  # same shape: no new compilation
    watch.phase(MEASURED)
    f(torch.randn(5))  # new shape: a recompilation
    watch.count(MEASURED, 2)
    f(torch.randn(4))  # cached again
    report = watch.finish()
    assert [e.kind for e in report.events] == ["compile", "recompile"]
    rec = report.recompiles[0]
    assert rec.phase == MEASURED and rec.function == "_plain"
    assert "size mismatch at index 0" in rec.reason and "expected 4, actual 5" in rec.reason
    m = report.metrics()
    assert m["compile.recompiles"].value == 1 and m["compile.per_step"].value == 0.5
    assert report.recompiles_every_step()  # one in two timed calls is at the threshold


def test_compiling_every_timed_step_is_flagged_and_once_is_not():
    torch._dynamo.reset()
    watch = CompileWatch.start()
    f = torch.compile(_plain, backend="eager", dynamic=False)
    f(torch.randn(2))
    watch.phase(MEASURED)
    for n in (3, 4, 5):
        f(torch.randn(n))
    watch.count(MEASURED, 3)
    report = watch.finish()
    assert report.metrics()["compile.per_step"].value == 1.0
    assert any("recompiles every step" in n for n in report.notes())

    torch._dynamo.reset()
    watch = CompileWatch.start()
    f = torch.compile(_plain, backend="eager", dynamic=False)
    f(torch.randn(2))
    watch.phase(MEASURED)
    for _ in range(3):
        f(torch.randn(2))
    watch.count(MEASURED, 3)
    report = watch.finish()
    assert not report.recompiles_every_step() and report.metrics()["compile.per_step"].value == 0.0
    assert not any("recompile" in n for n in report.notes())


def test_short_reason_keeps_the_heading_and_the_explanation():
    text = "Failed to trace builtin operator\n  Explanation: Dynamo does not know print\n  Hint: avoid it\n"
    assert short_reason(text) == "Failed to trace builtin operator: Dynamo does not know print"
    assert short_reason(None) == ""


def test_a_record_dynamo_dropped_cannot_hide_a_new_one(monkeypatch):
    """Dynamo keeps its records in a bounded deque (64 by default): a record dropped from it is freed,
    and a new record may be allocated at its address. A baseline of ids alone then took the new record
    for an old one and lost it (a run under `lmprof run` once showed no compilation at all, in a test
    worker that had compiled many frames before). The baseline holds the records themselves. Dynamo's
    records are stood in for, so that the freed one's memory is what the new one is given."""
    from collections import Counter
    from types import SimpleNamespace

    from lmprof.measure import compile_events

    def record(name: str) -> SimpleNamespace:
        return SimpleNamespace(compile_id="0/0", duration_us=10, entire_frame_compile_time_s=None, is_forward=True,
                               co_name=name, co_filename="f.py", co_firstlineno=1, restart_reasons=None,
                               recompile_reason=None)

    kept = [record("before")]
    fake = SimpleNamespace(get_compilation_metrics=lambda: list(kept), counters={"graph_break": Counter()},
                           set_compilation_metrics_limit=lambda n: None)
    monkeypatch.setattr(compile_events, "_dynamo_utils", lambda: fake)
    since = compile_events.baseline(load=True)
    kept.clear()  # dynamo dropped it
    kept.append(record("new"))
    report = CompileWatch.start(since=since).finish()
    assert [e.function for e in report.events] == ["new"], report.events


# Graph breaks as torch._dynamo.explain counts them (its graphs, minus one): the places the compiled code
# is split into graphs. lmprof counted frames that restarted their analysis instead: a break before any
# operator (one graph, no split) or after the last one counted, and a data-dependent branch (no restart
# recorded) did not (issue 49, item 13).
def _datadep(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum() > 0:  # a data-dependent branch: split, no restart recorded
        return y + 1
    return y - 1


def _print_first(x: torch.Tensor) -> torch.Tensor:
    print("step", end="\r")  # a break before any operator: one graph
    return x + 1


def _print_last(x: torch.Tensor) -> torch.Tensor:
    y = x + 1
    print("step", end="\r")  # a break after the last operator: one graph
    return y


def _item(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    return x * y.sum().item()  # Tensor.item(): split


def _nested(x: torch.Tensor) -> torch.Tensor:
    y = x * 3
    return _breaks(y) + 1  # a function that breaks, called after an operator: its frame is compiled on its own


@pytest.mark.parametrize("fn", [_datadep, _print_first, _print_last, _item, _breaks, _plain, _nested])
def test_graph_breaks_are_counted_as_torch_dynamo_explain_counts_them(fn):
    torch._dynamo.reset()
    truth = torch._dynamo.explain(fn)(torch.ones(3)).graph_break_count
    torch._dynamo.reset()
    watch = CompileWatch.start()
    compiled = torch.compile(fn, backend="eager")
    for _ in range(2):
        compiled(torch.ones(3))
    report = watch.finish()
    assert report.metrics()["compile.graph_breaks"].value == truth
    assert len([n for n in report.notes() if "graph break at" in n]) == truth
    torch._dynamo.reset()


def test_functions_compiled_apart_are_not_splits_of_one_another():
    """lmprof infer --compile compiles prefill and decode as two functions: their graphs are no split of
    one another (explain counts each call on its own, and the total is the sum: 0 + 1 + 1)."""
    functions = (_plain, _datadep, _breaks)
    torch._dynamo.reset()
    truth = sum(torch._dynamo.explain(f)(torch.ones(3)).graph_break_count for f in functions)
    torch._dynamo.reset()
    watch = CompileWatch.start()
    for f in functions:
        torch.compile(f, backend="eager")(torch.ones(3))
    report = watch.finish()
    assert truth == 2 and report.metrics()["compile.graph_breaks"].value == truth
    torch._dynamo.reset()
