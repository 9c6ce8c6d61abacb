"""The way a run was made (its door: lmprof train / infer, lmprof run, lmprof.profile(), the Python API,
the Trainer and Lightning callbacks), and how a user of that way turns each knob advice names.

Advice (advice.py) names the knob of the run's own door: ``--dtype bf16`` for ``lmprof train``,
``TrainingArguments(bf16=True)`` for the Hugging Face Trainer, the line of code for a script.
Pure data and one lookup: no I/O, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from lmprof.record.run import Run


@dataclass(frozen=True)
class Door:
    """How a run was made, and how a user of that way turns each knob the advice names."""

    name: str
    bf16: str  # compute in bf16
    compile: str  # torch.compile the model
    batch: str  # more sequences (or tokens) per step
    steps: str  # more timed steps and warm-up
    sdpa: str  # the fused attention kernel
    fused_optimizer: str  # a multi-tensor optimizer step
    cuda_graphs: str = 'in your code: torch.compile(model, mode="reduce-overhead")'  # CUDA graphs


_HF_SDPA = ('attn_implementation="sdpa" (or "flash_attention_2" on a supported GPU) when the model is built '
            "(from_pretrained / from_config)")
_OWN_CODE = dict(
    bf16="in your code: model.to(torch.bfloat16), or the forward under "
         "torch.autocast(device_type, dtype=torch.bfloat16)",
    compile="in your code: model = torch.compile(model)",
    batch="your loop's batch size (and sequence length)",
    sdpa="in your code: torch.nn.functional.scaled_dot_product_attention, or " + _HF_SDPA + " for a Hugging Face model",
    fused_optimizer="torch.optim.AdamW(..., fused=True) on CUDA, foreach=True elsewhere",
)
# config["source"] as each way writes it (integrations/, api.py, pipeline/usercode/assemble.py);
# lmprof train / infer write none (a sweep point of theirs neither).
DOORS: dict[str, Door] = {
    "TrainerCallback": Door(
        "the Hugging Face Trainer", bf16="TrainingArguments(bf16=True)", compile="TrainingArguments(torch_compile=True)",
        batch="TrainingArguments(per_device_train_batch_size=...)",
        steps="TrainerCallback(steps=..., warmup=...)", sdpa=_HF_SDPA,
        fused_optimizer='TrainingArguments(optim="adamw_torch_fused")',
        cuda_graphs='TrainingArguments(torch_compile=True, torch_compile_mode="reduce-overhead")'),
    "LightningCallback": Door(
        "the Lightning Trainer", bf16='Trainer(precision="bf16-mixed")',
        compile="model = torch.compile(model) before trainer.fit(model)",
        batch="the batch_size of your DataLoader", steps="LightningCallback(steps=..., warmup=...)",
        sdpa=_OWN_CODE["sdpa"],
        fused_optimizer="in configure_optimizers: torch.optim.AdamW(..., fused=True) on CUDA, foreach=True elsewhere",
        cuda_graphs='model = torch.compile(model, mode="reduce-overhead") before trainer.fit(model)'),
    "lmprof.profile": Door("lmprof.profile()", steps="lmprof.profile(model, steps=..., warmup=...)", **_OWN_CODE),
    "lmprof.profile_training": Door(
        "lmprof.profile_training()", bf16='lmprof.profile_training(..., dtype="bf16")',
        compile="model = torch.compile(model) before lmprof.profile_training", batch="larger batches in what you pass",
        steps="lmprof.profile_training(..., steps=..., warmup=...)", sdpa=_OWN_CODE["sdpa"],
        fused_optimizer="the optimizer you pass: torch.optim.AdamW(..., fused=True) on CUDA, foreach=True elsewhere"),
    "lmprof.profile_inference": Door(
        "lmprof.profile_inference()", bf16="model.to(torch.bfloat16) before lmprof.profile_inference",
        compile="model = torch.compile(model) before lmprof.profile_inference", batch="more rows in input_ids",
        steps="lmprof.profile_inference(..., steps=..., warmup=...)", sdpa=_OWN_CODE["sdpa"], fused_optimizer=""),
    "user code": Door("lmprof run", steps="lmprof run --steps N --warmup N", **_OWN_CODE),
    "train": Door("lmprof train", bf16="--dtype bf16", compile="--compile", batch="--batch-size, --seq-len",
                  steps="--steps and --warmup", sdpa="--attention sdpa (scaled_dot_product_attention)",
                  fused_optimizer="in your own training code: torch.optim.AdamW(..., fused=True) on CUDA, "
                                  "foreach=True elsewhere",
                  cuda_graphs="--compile --compile-mode reduce-overhead"),
    "infer": Door("lmprof infer", bf16="--dtype bf16", compile="--compile", batch="--batch-size",
                  steps="--steps and --warmup", sdpa="--attention sdpa (scaled_dot_product_attention)",
                  fused_optimizer="",
                  cuda_graphs="--compile --compile-mode reduce-overhead"),
}


def door_of(run: Run) -> Door:
    """The way the run was made, from run.json's ``config.source`` (none: ``lmprof train`` / ``infer``)."""
    source = run.config.get("source")
    if isinstance(source, str) and source in DOORS:
        door = DOORS[source]
    elif source is None:
        door = DOORS[run.mode]
        if run.config.get("hf") or run.config.get("hf_config"):  # --attention is the built-in GPT's
            door = replace(door, sdpa=_HF_SDPA)
    else:  # a way this lmprof does not know (a newer one): the user's own code
        door = Door(str(source)[:60], steps="more steps and warm-up", **_OWN_CODE)
    return door
