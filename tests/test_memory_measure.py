"""Measured memory: exact static bytes, the CPU timeline, the estimate against a real step, CUDA via a fake."""
from __future__ import annotations

import json

import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import record_function

from lmprof.estimate.memory import estimate_memory, memory_metrics, memory_table
from lmprof.measure import memory as measure_memory
from lmprof.measure.memory import SNAPSHOT_NAME
from lmprof.measure.memory_timeline import classify, timeline_from_trace
from lmprof.measure.tensor_bytes import static_memory, tensor_bytes
from lmprof.show.memory_plot import plot_memory_timeline, timeline_title
from lmprof.workloads.gpt import GPT, PRESETS, KVCache
from lmprof.workloads.training import plain_train_step
from memory_step import measure_step_memory

TINY = PRESETS["tiny"]


def _train_step(model: GPT, opt: torch.optim.Optimizer, batch: int, seq: int, vocab: int, like_lmprof: bool = False):
    """A training step that keeps ``logits, loss`` to its end with parts marked by record_function (the
    other way the figures step reads), or lmprof's plain step (step_scope, only the loss kept)."""

    def data() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))

    if like_lmprof:
        return plain_train_step(model, opt, data, lambda m, xy: m(*xy)[1])

    def step() -> None:
        with record_function("lmprof:data"):
            x, y = data()
        with record_function("lmprof:forward"):
            logits, loss = model(x, y)  # logits stay alive through backward and the optimizer step
        with record_function("lmprof:backward"):
            loss.backward()
        with record_function("lmprof:optimizer"):
            opt.step()
        with record_function("lmprof:zero_grad"):
            opt.zero_grad(set_to_none=True)

    return step


@pytest.fixture(scope="module")
def tiny_run() -> dict[str, Any]:
    """One measured steady-state step of the tiny GPT (fp32, math attention, AdamW, B=4, T=64)."""
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = _train_step(model, opt, 4, 64, TINY.vocab_size)
    measured = measure_step_memory(step, model, opt, "cpu", warmup=1)
    return {"model": model, "opt": opt, "measured": measured}


def test_static_bytes_exact_for_tiny_adamw(tiny_run: dict[str, Any]) -> None:
    m = tiny_run["measured"]
    # 834,432 fp32 parameters (lm_head tied to wte: counted once).
    assert m.static.n_params == 834_432
    assert m.value("params")[0] == 834_432 * 4 == 3_337_728
    assert m.value("grads")[0] == 3_337_728
    # AdamW: exp_avg + exp_avg_sq per parameter, plus a 0-dim fp32 `step` per parameter tensor
    # (52 tensors). The step counters are real optimizer.state memory, so they count.
    assert m.static.optimizer_scalars == 52 * 4
    assert m.value("optimizer")[0] == 2 * 3_337_728 + 52 * 4 == 6_675_664
    assert m.static.buffers == 4 * 256 * 256  # the causal masks


def test_tensor_bytes_counts_shared_storage_once() -> None:
    w = torch.zeros(10, 10)
    assert tensor_bytes([w, w]) == 400  # tied: same tensor twice
    assert tensor_bytes([w, w[2:5], w.t()]) == 400  # views of one storage
    assert tensor_bytes([w[:2], w[5:]]) == 280  # disjoint slices: only what they reach
    assert tensor_bytes([torch.zeros(3, dtype=torch.bfloat16), torch.zeros(0)]) == 6
    model = GPT(replace(TINY, n_layer=1))
    assert model.lm_head.weight is model.transformer.wte.weight
    assert static_memory(model).params == model.config.shape().n_params() * 4


def test_timeline_forward_rises_backward_falls(tiny_run: dict[str, Any]) -> None:
    tl = tiny_run["measured"].timeline
    names = [p.name for p in tl.phases]
    assert names == ["data", "forward", "backward", "optimizer", "zero_grad"]
    fwd = tl.phases[1]
    bwd = tl.phases[2]
    start, end_fwd, end_bwd = tl.level_at(fwd.start_ms), tl.level_at(fwd.end_ms), tl.level_at(bwd.end_ms)
    assert end_fwd - start > 5_000_000  # ~9.9 MB of activations appear during forward
    assert end_bwd < tl.phase_peak("backward")  # and are released during backward
    assert tl.peak_phase == "backward"
    # Activations at the end of forward are gone at the end of backward; gradients took their place.
    i_fwd = max(i for i, t in enumerate(tl.t_ms) if t <= fwd.end_ms)
    i_bwd = max(i for i, t in enumerate(tl.t_ms) if t <= bwd.end_ms)
    assert tl.categories["activations"][i_fwd] > 9_000_000
    assert tl.categories["activations"][i_bwd] == 0
    assert tl.categories["grads"][i_bwd] == 3_337_728
    assert tl.categories["params"][0] == 3_337_728 + 4 * 256 * 256
    # Every point's categories add up to the total.
    for k in range(0, len(tl.t_ms), 97):
        assert sum(tl.categories[c][k] for c in tl.categories) == tl.allocated[k]


def test_estimate_matches_measured_cpu_step(tiny_run: dict[str, Any]) -> None:
    m = tiny_run["measured"]
    est = estimate_memory(TINY.shape(), batch=4, seq_len=64, device_kind="cpu", hold_logits=True)
    rows = {r["category"]: r for r in memory_table(est, m)}
    for exact in ("params", "grads", "optimizer"):
        assert rows[exact]["measured_bytes"] == rows[exact]["estimated_bytes"]
    # Activations (end of forward minus its start) and the peak agree to well under 1%.
    assert abs(rows["activations"]["diff_pct"]) < 1.0
    assert abs(rows["peak"]["diff_pct"]) < 1.0
    metrics = memory_metrics(est, m)
    assert metrics["memory.peak"].source == "measured" and metrics["memory.peak"].value == m.peak
    assert metrics["memory.estimated.peak"].source == "estimated"
    assert metrics["memory.activations"].unit == "B"


def test_sdpa_estimate_matches_measured() -> None:
    torch.manual_seed(0)
    cfg = replace(TINY, attention="sdpa", n_layer=2)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = _train_step(model, opt, 2, 32, cfg.vocab_size, like_lmprof=True)  # the figures step turns scopes on
    m = measure_step_memory(step, model, opt, "cpu", warmup=1)
    assert [p.name for p in m.timeline.phases] == ["data", "forward", "backward", "optimizer", "zero_grad"]
    est = estimate_memory(cfg.shape(), batch=2, seq_len=32, attention="sdpa", device_kind="cpu")
    assert abs(m.activations - est.activations) <= 0.01 * est.activations  # the logits died in forward
    assert abs(m.peak - est.peak) <= 0.01 * est.peak


def test_inference_memory_cpu() -> None:
    """The cache is made inside the generation, as lmprof infer's decoder makes it."""
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    x = torch.randint(0, TINY.vocab_size, (2, 32))
    caches: list[KVCache] = []

    def run() -> None:
        with torch.inference_mode():
            cache = KVCache(TINY, 2, 40, torch.device("cpu"), torch.float32)
            caches.append(cache)
            with record_function("lmprof:prefill"):
                logits, _ = model(x, cache=cache, pos=0)
            with record_function("lmprof:decode"):
                tok = logits[:, -1].argmax(-1, keepdim=True)
                for i in range(8):
                    logits, _ = model(tok, cache=cache, pos=32 + i)
                    tok = logits[:, -1].argmax(-1, keepdim=True)

    m = measure_step_memory(run, model, None, "cpu", mode="infer")
    est = estimate_memory(TINY.shape(), batch=2, seq_len=32, mode="infer", new_tokens=8, device_kind="cpu")
    assert caches[0].nbytes() == est.kv_cache == 2 * 4 * 4 * 32 * 40 * 2 * 4
    assert m.timeline.peak_phase == "prefill"
    assert abs(m.peak - est.peak) <= 0.02 * est.peak
    assert m.value("grads")[0] is None


def test_classify_rules() -> None:
    assert classify("forward", "backward", True) == "activations"
    assert classify("forward", "forward", True) == "temporaries"
    assert classify("forward", None, True) == "outputs"
    assert classify("backward", "zero_grad", True) == "grads"
    assert classify("backward", None, False) == "grads"
    assert classify("backward", "backward", True) == "temporaries"
    assert classify("optimizer", None, False) == "optimizer"
    assert classify("optimizer", "optimizer", True) == "temporaries"
    assert classify("data", "forward", True) == "other"


def _mem(ts: float, nbytes: int, addr: int, dev_type: int = 1, idx: int = 0) -> dict[str, Any]:
    return {"ph": "i", "name": "[memory]", "ts": ts,
            "args": {"Bytes": nbytes, "Addr": addr, "Device Type": dev_type, "Device Id": 0, "Ev Idx": idx}}


def _phase(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"lmprof:{name}", "ts": ts, "dur": dur}


def test_timeline_from_synthetic_cuda_trace(tmp_path) -> None:
    """A hand-made CUDA trace: each block's lifetime decides its category; CPU events are ignored."""
    events = [
        _phase("forward", 0, 100), _phase("backward", 100, 100), _phase("optimizer", 200, 50),
        _phase("zero_grad", 250, 10),
        _mem(10, 1000, 1), _mem(20, 500, 2), _mem(30, -500, 2),  # activation, forward temporary
        _mem(40, 7777, 99, dev_type=0),  # a CPU allocation: not this device
        _mem(110, 300, 3), _mem(120, -1000, 1),  # a gradient appears, the activation goes
        _mem(210, 200, 4), _mem(220, -200, 4), _mem(230, 50, 5),  # optimizer temp, new state
        _mem(255, -300, 3),  # zero_grad frees the gradient
        _mem(256, -64, 77),  # a block from before the trace
    ]
    trace = tmp_path / "memory.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    tl = timeline_from_trace(trace, "cuda:0", {"params": 4000})
    assert tl.events == 10
    assert tl.allocated == [5000, 5500, 5000, 5300, 4300, 4500, 4300, 4350, 4050, 3986]
    assert tl.activations == 1000  # end of forward minus its start
    assert tl.peak == 5500 and tl.peak_phase == "forward"
    assert tl.categories["activations"][0] == 1000
    assert tl.categories["temporaries"][1] == 500
    assert tl.categories["grads"][3] == 300
    assert tl.categories["optimizer"][7] == 50
    assert tl.categories["other"][-1] == 0  # the unknown free is taken from the lowest-priority band
    assert any("before profiling" in n for n in tl.notes)


class FakeCuda:
    """Stands in for torch.cuda at lmprof's boundary: records calls, reports fixed numbers."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.recording = False

    def synchronize(self, device: torch.device) -> None:
        self.calls.append("synchronize")

    def reset_peak(self, device: torch.device) -> None:
        self.calls.append("reset_peak")

    def memory_allocated(self, device: torch.device) -> int:
        return 50_000_000

    def max_memory_allocated(self, device: torch.device) -> int:
        self.calls.append("max_memory_allocated")
        return 123_456_789

    def memory_stats(self, device: torch.device) -> dict[str, Any]:
        return {"allocated_bytes.all.peak": 123_456_789, "reserved_bytes.all.peak": 150_000_000,
                "num_alloc_retries": 0, "num_ooms": 0, "active.all.current": 5}

    def start_history(self, max_entries: int) -> None:
        self.calls.append("start_history")
        self.recording = True

    def dump_snapshot(self, path: str) -> None:
        assert self.recording, "snapshot dumped while history was not recorded"
        self.calls.append("dump_snapshot")
        Path(path).write_bytes(pickle.dumps({"segments": [], "device_traces": []}))

    def stop_history(self) -> None:
        self.calls.append("stop_history")
        self.recording = False


def test_cuda_path_with_fake_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    cfg = replace(TINY, n_layer=1)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fake = FakeCuda()
    monkeypatch.setattr(measure_memory, "TorchCuda", lambda: fake)
    m = measure_step_memory(_train_step(model, opt, 2, 16, cfg.vocab_size), model, opt, "cuda:0", out_dir=tmp_path)
    assert m.peak == 123_456_789
    assert "max_memory_allocated" in m.peak_source
    assert m.cuda_stats == {"allocated_peak": 123_456_789, "reserved_peak": 150_000_000, "alloc_retries": 0, "ooms": 0}
    assert fake.calls.index("reset_peak") < fake.calls.index("start_history") < fake.calls.index("dump_snapshot")
    assert fake.calls.index("dump_snapshot") < fake.calls.index("stop_history") < fake.calls.index("max_memory_allocated")
    assert m.snapshot_path == str(tmp_path / SNAPSHOT_NAME) and (tmp_path / SNAPSHOT_NAME).is_file()
    # Exact static bytes do not depend on the device; the timeline has no CUDA events here.
    assert m.value("params")[0] == cfg.shape().n_params() * 4
    assert m.timeline is not None and m.timeline.events == 0
    assert m.timeline.baseline == 50_000_000  # memory_allocated before the step, split into categories
    # No snapshot without an output folder.
    fake2 = FakeCuda()
    monkeypatch.setattr(measure_memory, "TorchCuda", lambda: fake2)
    m2 = measure_step_memory(_train_step(model, opt, 2, 16, cfg.vocab_size), model, opt, "cuda")
    assert m2.snapshot_path is None and "start_history" not in fake2.calls


def test_memory_plot_png(tiny_run: dict[str, Any], tmp_path: Path) -> None:
    est = estimate_memory(TINY.shape(), batch=4, seq_len=64, device_kind="cpu", hold_logits=True)
    out = plot_memory_timeline(tiny_run["measured"].timeline, tmp_path / "memory.png",
                               timeline_title("tiny", 4, 64, "fp32", "cpu"), estimated_peak=est.peak)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_an_older_tensor_freed_inside_the_forward_does_not_lower_the_activations():
    """A block allocated before the forward and freed inside it (a collector pass freeing another
    object's tensor, here a 1 MB buffer dropped by a forward pre-hook) is not the forward's: the
    activations are what the forward allocated and still holds, the same bytes with or without it."""
    def measured(drop: bool) -> int:
        torch.manual_seed(0)
        model = GPT(TINY)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step = _train_step(model, opt, 4, 64, TINY.vocab_size)
        held: list[torch.Tensor] = []

        def refill() -> None:
            held[:] = [torch.ones(262_144)]  # 1 MiB, allocated in the data part, before the forward
            step()

        hook = model.register_forward_pre_hook(lambda m, a: held.clear() if drop else None)
        try:
            return measure_step_memory(refill, model, opt, "cpu", warmup=1).value("activations")[0]
        finally:
            hook.remove()

    assert measured(drop=True) == measured(drop=False)
