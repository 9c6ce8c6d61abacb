"""The dtype a user's training step computes in: autocast's, TF32's, not only the weights'.

The common training loop keeps fp32 weights and runs its forward under ``torch.autocast`` (nanoGPT's
``ctx``, Accelerate's ``mixed_precision``), or allows TF32 matmuls on CUDA. lmprof read the dtype off the
weights: MFU against the fp32 peak, which is 15x below the bf16 peak on an H100 (2x on this CPU), and
the run's dtype fp32. Now the model's forward pre-hook (the shapes window, clean and profiled steps) reads
the autocast state as the forward begins. Truth: the dtype torch's dispatcher sees the step's matmuls run
in (a TorchDispatchMode over a step of the same loop).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import lmprof
from lmprof.pipeline.protocol.windows.shapes import StepShapes
from lmprof.record.catalogue import BYTES_MODEL, FLOPS_MODEL, MBU, MFU
from lmprof.record.run import Run
from lmprof.workloads.precision import dtype_name

tf = pytest.importorskip("transformers")
B, T = 2, 16


class _MatmulDtypes(TorchDispatchMode):
    """The dtypes of the weight matmuls' inputs (mm, addmm: the bulk of a step's FLOPs), as the dispatcher runs
    them. (CPU autocast leaves the attention core's bmm in fp32; CUDA autocast runs it in bf16 too.)"""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.seen.add(dtype_name(args[1 if func.overloadpacket is torch.ops.aten.addmm else 0].dtype))
        return func(*args, **(kwargs or {}))


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    return tf.AutoModelForCausalLM.from_config(cfg).train()


def _olmo() -> nn.Module:
    from lmprof.measure.model_facts.tiny import tiny_config

    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(tiny_config("olmo")).train()


Step = Callable[[nn.Module, torch.optim.Optimizer, int], None]


def _autocast(model: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    x = torch.randint(3, 100, (B, T), generator=torch.Generator().manual_seed(i))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def _profiled(tmp_path: Path, model: nn.Module, step: Step) -> Run:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False) as prof:
        for i in range(14):
            step(model, opt, i)
            prof.step()
    return Run.load(prof.folder)


def _matmul_dtypes(model: nn.Module, step: Step) -> set[str]:
    with _MatmulDtypes() as seen:
        step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), 0)
    return seen.seen


def test_an_autocast_step_is_measured_against_the_peak_of_the_dtype_it_ran_in(tmp_path: Path) -> None:
    assert _matmul_dtypes(_gpt2(), _autocast) == {"bf16"}  # what the step ran in
    run = _profiled(tmp_path, _gpt2(), _autocast)
    assert (run.config["dtype"], run.config["param_dtype"]) == ("bf16", "fp32")  # the old code: fp32, none
    assert "peak bf16" in (run.metrics[MFU].note or "")
    assert any(n.startswith("autocast: the forwards ran under bf16") for n in run.notes)


def test_a_model_read_off_the_meta_device_under_autocast_has_no_bytes(tmp_path: Path) -> None:
    """The describer builds the model in its weights' dtype: its bytes are fp32's, not the run's."""
    run = _profiled(tmp_path, _olmo(), _autocast)
    assert run.metrics[FLOPS_MODEL].value and "peak bf16" in (run.metrics[MFU].note or "")
    for key in (BYTES_MODEL, MBU):
        assert run.metrics[key].value is None and "autocast" in (run.metrics[key].note or "")
    assert all(b.bytes is None for b in run.blocks)


def test_forwards_with_and_without_autocast_keep_the_weights_peak(tmp_path: Path) -> None:
    def sometimes(model: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
        x = torch.randint(3, 100, (B, T), generator=torch.Generator().manual_seed(i))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=i % 2 == 0):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()

    run = _profiled(tmp_path, _gpt2(), sometimes)
    assert run.config["dtype"] == "fp32" and "peak fp32" in (run.metrics[MFU].note or "")
    assert any("different autocast settings (bf16, none)" in n for n in run.notes)


def test_tf32_matmuls_are_measured_against_the_tf32_peak() -> None:
    """On CUDA with TF32 allowed, fp32 matmuls run on tensor cores (no GPU here: the rule itself)."""
    shapes = StepShapes(autocast={None}, tf32=True)
    dtype, note = shapes.compute_dtype("fp32")
    assert dtype == "tf32" and note and "TF32 peak" in note
    assert StepShapes(autocast={"bf16"}, tf32=False).compute_dtype("fp32")[0] == "bf16"
    assert StepShapes(autocast={None}, tf32=False).compute_dtype("fp32") == ("fp32", None)
    assert StepShapes(autocast={None}, tf32=True).compute_dtype("bf16") == ("bf16", None)  # bf16 weights: no TF32


def test_the_trainer_s_bf16_is_read_inside_the_forward(tmp_path: Path) -> None:
    """``TrainingArguments(bf16=True)``: Accelerate enters autocast inside ``model.forward`` (it wraps the
    method), after the model's own pre-hooks ran: lmprof reads it at the first matmul module's."""
    from transformers import Trainer, TrainingArguments

    model = _gpt2()
    data = [{"input_ids": t, "labels": t} for t in torch.randint(3, 100, (16 * B, T))]
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=16, per_device_train_batch_size=B,
                             logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
                             disable_tqdm=True, seed=0, bf16=True)
    callback = lmprof.integrations.TrainerCallback(out=tmp_path / "runs", verbose=False, report=False)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    run = callback.run
    assert run is not None and (run.config["dtype"], run.config["param_dtype"]) == ("bf16", "fp32")
    assert "peak bf16" in (run.metrics[MFU].note or "")


def _generated_under_autocast(tmp_path: Path, model: nn.Module) -> Run:
    """``generate()`` under CPU bf16 autocast, 8 times, under ``lmprof.profile(infer=True)``."""
    x = torch.randint(3, 100, (B, 8), generator=torch.Generator().manual_seed(0))
    with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False, infer=True) as prof:
        for _ in range(8):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=4, min_new_tokens=4,
                               do_sample=False, pad_token_id=0)
            prof.step()
    return Run.load(prof.folder)


def test_generations_under_autocast_have_its_peak_and_its_cache(tmp_path: Path) -> None:
    """``generate()`` under bf16 autocast with fp32 weights: prefill and decode MFU against the bf16 peak, and
    the KV cache estimate in bf16, as the cache the projections made is (the measured cache's bytes)."""
    run = _generated_under_autocast(tmp_path, _gpt2().eval())
    assert (run.config["dtype"], run.config["param_dtype"]) == ("bf16", "fp32")
    assert all("peak bf16" in (run.metrics[k].note or "") for k in ("prefill.mfu", "decode.mfu"))
    assert run.value("kv_cache") and run.value("kv_cache.estimated") == run.value("kv_cache")  # old: 2x, fp32's


def test_generations_of_a_described_model_under_autocast_have_no_cache_estimate(tmp_path: Path) -> None:
    """The describer's cache is its build dtype's (the weights'); autocast's cache is another: n/a, said why."""
    run = _generated_under_autocast(tmp_path, _olmo().eval())
    estimate = run.metrics["kv_cache.estimated"]
    assert run.value("kv_cache") and estimate.value is None and "autocast" in (estimate.note or "")
    assert run.value("prefill.flops.model_per_step")  # the FLOPs stand


def test_a_run_without_clean_steps_reads_the_dtype_in_its_profiled_ones(tmp_path: Path) -> None:
    """The dtype is read in the clean steps, and only there once read (a hook in the profiled steps is their
    blocks' "other"); a run with none reads it where it can."""
    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False, warmup=1, steps=0,
                        profile_steps=1) as prof:
        for i in range(4):
            _autocast(model, opt, i)
            prof.step()
    run = Run.load(prof.folder)
    assert (run.config["dtype"], run.config["param_dtype"]) == ("bf16", "fp32")


FP64_LOOP = """
import json, sys, torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=500, attn_implementation="eager")
# eager attention: its matmuls are ops torch's FlopCounterMode counts (it has no formula for the CPU's flash kernel)
model = LlamaForCausalLM(cfg).double()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, 500, (2, 32))
def step():
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad()
for _ in range(20):
    step()
with FlopCounterMode(display=False) as counter:
    model(input_ids=x, labels=x).loss.backward()
model.zero_grad()
json.dump({"flops": counter.get_total_flops()}, open(sys.argv[1], "w"))
"""


def test_a_float64_model_gets_its_run_its_peak_and_a_refused_memory_estimate(run_script) -> None:
    """A model in float64 (gradient checks, numerics) lost its whole run: the memory formulas refused fp64 and
    that refusal ended the write ("could not write the report (ConfigError: dtype must be one of fp32, bf16, fp16,
    got 'torch.float64')")."""
    pytest.importorskip("transformers")
    done = run_script(FP64_LOOP)
    assert done.code == 0 and done.record is not None, done.err
    record = done.record
    assert record["config"]["dtype"] == "fp64"
    # the model's FLOPs read off the meta device, against torch's own count of the script's step
    assert record["metrics"]["flops.model_per_step"]["value"] == pytest.approx(done.own["flops"], rel=0.005)
    assert "peak fp64 FLOP/s" in record["metrics"]["mfu"]["note"]
    assert any(n.startswith("no memory estimate: the formulas model fp32, bf16, fp16 and this run is fp64")
               for n in record["notes"]), record["notes"]
    assert "memory.peak" in record["metrics"] and "memory.estimated.peak" not in record["metrics"]


def test_the_dtype_is_read_once_a_generation_not_at_every_forward(tmp_path: Path, monkeypatch) -> None:
    """Each read runs inside the user's forward; a decode forward of a small model takes well under a
    millisecond (benchmarks/generation_overhead.py), so the first matmul module's hook reads at a step's first
    forward only. The figures still see the generations' autocast (as in the test of their peak above)."""
    from lmprof.pipeline.protocol.windows.shapes import ShapesWindow

    reads: list[set[str | None]] = []
    compute = ShapesWindow._compute
    monkeypatch.setattr(ShapesWindow, "_compute", lambda self, into: (reads.append(into), compute(self, into))[1])
    forwards = []
    model = _gpt2().eval()
    model.register_forward_hook(lambda *_: forwards.append(1))
    run = _generated_under_autocast(tmp_path, model)
    assert len(forwards) == 8 * 4  # the prefill and three decode forwards, 8 generations
    assert 0 < len(reads) <= 8  # one a generation at most (old: one a forward of each clean and profiled one)
    assert "peak bf16" in (run.metrics["decode.mfu"].note or "")
