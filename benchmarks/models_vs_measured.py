"""The analytic model against measurement, for a shrunk random-weight instance of every table family.

Prints, per family: parameters (lmprof vs the built transformers model), matmul FLOPs for a training
forward + backward, a prefill and one decode step (lmprof vs FlopCounterMode, eager attention and
experts), and the bytes of one fp32 CPU training step, B=4, T=48 (lmprof's estimate vs the step
measured as a run's figures step measures it (tests/memory_step.py): live tensors for
params/grads/optimizer, the allocation timeline for activations and peak). Needs transformers; no
download.

    PYTHONPATH=src python benchmarks/models_vs_measured.py
"""
from __future__ import annotations

import sys
from dataclasses import astuple
from pathlib import Path

import torch
import transformers as tf

from lmprof.estimate.flops import FlopConventions, block_costs
from lmprof.estimate.memory import estimate_memory
from lmprof.measure.flops import count_causal_lm_flops
from lmprof.estimate.models import shape_from_config, shrunk_config
from lmprof.workloads.training import plain_train_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from memory_step import measure_step_memory  # noqa: E402

FAMILIES = ["gpt2", "llama-3-8b", "mistral-7b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen2.5-7b", "gemma-2-2b",
            "phi-3-mini-4k", "pythia-160m", "opt-125m", "falcon-7b", "falcon-40b"]
DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout", "dropout",
            "activation_dropout")
ALL = FlopConventions(prefill_logits="all")


def build(name: str, attn: str):  # type: ignore[no-untyped-def]
    cfg = shrunk_config(name)
    for k in DROPOUTS:
        cfg[k] = 0.0
    hc = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    kw = {"experts_implementation": "eager"} if hc.model_type in ("mixtral", "qwen2_moe") else {}
    torch.manual_seed(0)
    attn = "eager" if hc.model_type == "gemma2" else attn
    return tf.AutoModelForCausalLM.from_config(hc, attn_implementation=attn, **kw), shape_from_config(hc.to_dict())


def matmul(shape, phase: str, b: int, t: int) -> float:  # type: ignore[no-untyped-def]
    return sum(c.matmul_flops for c in block_costs(shape, batch=b, seq_len=t, phase=phase, dtype="fp32",
                                                   conventions=ALL))


def flops_row(name: str) -> str:
    model, shape = build(name, "eager")
    b, t = 2, 12
    train, prefill, decode = astuple(count_causal_lm_flops(model, torch.randint(3, 128, (b, t))))
    n = sum(p.numel() for p in model.parameters())
    cols = [(n, shape.n_params()), (train, matmul(shape, "forward", b, t) + matmul(shape, "backward", b, t)),
            (prefill, matmul(shape, "prefill", b, t)), (decode, matmul(shape, "decode", b, t + 1))]
    return " | ".join(f"{m:,} / {a:,.0f} ({100 * (a - m) / m:+.2f}%)" for m, a in cols)


def memory_row(name: str) -> str:
    model, shape = build(name, "sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b, t = 4, 48

    step = plain_train_step(model, opt, lambda: torch.randint(3, 128, (b, t)),
                            lambda m, x: m(input_ids=x, labels=x).loss)

    m = measure_step_memory(step, model, opt, "cpu", warmup=1)
    est = estimate_memory(shape, batch=b, seq_len=t, mode="train", dtype="fp32", param_dtype="fp32",
                          attention="sdpa", device_kind="cpu")
    cols = [("params", est.params), ("grads", est.grads), ("optimizer", est.optimizer_state),
            ("activations", est.activations), ("peak", est.peak)]
    out = []
    for key, e in cols:
        v = m.value(key)[0]
        out.append(f"{v:,} / {e:,} ({100 * (e - v) / v:+.1f}%)" if v else "n/a")
    return " | ".join(out)


def main() -> None:
    print("matmul FLOPs and params, measured (FlopCounterMode / the model) / lmprof (diff):")
    print("| family | params | train fwd+bwd | prefill | decode |\n|---|---|---|---|---|")
    for name in FAMILIES:
        print(f"| {name} | {flops_row(name)} |")
    print("\nbytes of one fp32 CPU training step, measured / lmprof (diff):")
    print("| family | params | grads | optimizer | activations | peak |\n|---|---|---|---|---|---|")
    for name in FAMILIES:
        print(f"| {name} | {memory_row(name)} |")


if __name__ == "__main__":
    main()
