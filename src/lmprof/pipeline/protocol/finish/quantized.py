"""The figures of a model whose weights are quantized (measure/model_facts/quantized.py).

Its model FLOPs are its config's (quantization changes number formats, not the math). Its bytes are not the
formulas' (they read each weight in the model's dtype), so bytes, MBU, the roofline and the memory
estimate are n/a; MFU is against the peak of the dtype its matmuls run in, which is the activations' for
weight-only quantization and int8 for dynamic quantization, whose peak lmprof does not know.
"""
from __future__ import annotations

from lmprof.measure.model_facts.quantized import Quantized
from lmprof.pipeline.protocol.finish.costs import passes
from lmprof.record.catalogue import HFU, MFU, cost_key
from lmprof.record.run import Metric, Run

# torch's FlopCounterMode has no formula for a quantized kernel (quantized::linear_dynamic)
COUNTS_NO_QUANTIZED = "FlopCounterMode counts no quantized kernel, so a count of this model's step misses its matmuls"


def quantized_note(q: Quantized) -> str:
    """The run's note for a model with quantized weights."""
    runs_in = ("the activations' dtype (the weights are widened first)" if q.matmuls is None
               else "a format lmprof does not know" if q.matmuls == "unknown" else q.matmuls)
    return (f"quantized weights: {q.kind}" + (f", {q.layers} layer{'s' if q.layers != 1 else ''}" if q.layers else "")
            + f"; its matmuls run in {runs_in}. Model FLOPs are its config's (quantization changes number formats, "
            "not the math), counting each quantized weight at its logical shape"
            + (f"; memory.params leaves out the {q.hidden:,} weights held packed outside the model's parameters "
               "(torch.ao keeps them in C++ objects, not tensors lmprof can measure)" if q.hidden and q.kind.startswith("torch.ao")
               else ""))


def quantized_bytes(q: Quantized | None) -> str | None:
    """Why the formulas' bytes are not a quantized model's (None: its weights are not quantized)."""
    if q is None:
        return None
    return f"the weights are quantized ({q.kind}): the formulas' bytes read each weight in the model's dtype"


def withhold_peak(run: Run, q: Quantized) -> None:
    """MFU and HFU n/a where the quantized matmuls run in a format whose peak lmprof does not know."""
    if q.matmuls is None:
        return
    why = (f"the matmuls run in {q.matmuls} ({q.kind}): lmprof knows no {q.matmuls} peak" if q.matmuls != "unknown"
           else f"the quantized matmuls ({q.kind}) run in a format lmprof does not know, so it has no peak for them")
    for p in passes(run):
        for key in (MFU, HFU):
            if cost_key(p, key) in run.metrics:
                run.metrics[cost_key(p, key)] = Metric.na("%", why, source="derived")
