"""Print the full-size figures of the shipped model table (docs/flops-and-roofline.md, "Known models").

Per model: parameters total / active, forward matmul FLOPs per token (2 x active matmul weights,
lm_head in, input embedding out; attention adds 4 x layers x q_dim x keys on top), KV-cache bytes per
token in bf16, and the roofline time of ONE decode step per token on an H100 SXM (bf16, table peaks)
at batch 1 and 64 with a KV length of 2,048 (or the model's maximum if smaller). Analytic, estimated.

    PYTHONPATH=src python benchmarks/model_table.py
"""
from __future__ import annotations

from lmprof.estimate.flops import FlopConventions, block_costs
from lmprof.estimate.roofline import phase_roofline
from lmprof.hardware.calibrate import resolve_peak
from lmprof.estimate.models import known_models, resolve_model


def main() -> None:
    peak = resolve_peak("h100", "cuda", "bf16")
    conv = FlopConventions(prefill_logits="all")
    print("| model | params total | active | fwd GFLOP/token (weights) | KV KiB/token (bf16) "
          "| decode ms/token B=1 | decode ms/token B=64 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in known_models():
        s = resolve_model(name).shape
        if s is None:  # a family the formulas do not know: `lmprof roofline --model NAME` reads it off the model
            continue
        kv_len = min(2048, s.block_size)
        times = []
        for b in (1, 64):
            costs = block_costs(s, batch=b, seq_len=1, phase="decode", context=kv_len, dtype="bf16", conventions=conv)
            r = phase_roofline(costs, b, b, peak.flops_per_s, peak.bytes_per_s)
            times.append(r.time_s / b * 1e3)
        print(f"| {name} | {s.n_params() / 1e9:.3f} B | {s.n_params(active=True) / 1e9:.3f} B "
              f"| {2 * s.matmul_weights(active=True) / 1e9:.2f} | {s.kv_elements_per_token() * 2 / 1024:.0f} "
              f"| {times[0]:.3f} | {times[1]:.4f} |")


if __name__ == "__main__":
    main()
