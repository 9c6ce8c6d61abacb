"""The model's own forward outside its modules (``model_glue``), the loss wherever the model computes
it (``loss``) and the autograd engine between nodes (``autograd_engine``) are rows of their own, so
``other`` holds only what nothing claims (issue 31).

Truths: the trace's own events (every range nests inside its phase's range; the loss operators run
inside the loss range), and the objects lmprof patched are the user's own again afterwards.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

import lmprof
from lmprof.record.run import Run
from lmprof.workloads.hooks import module_scopes

transformers = pytest.importorskip("transformers")

B, T = 2, 16


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0))


def _ranges(folder: Path) -> dict[str, list[tuple[float, float]]]:
    events = json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
    out: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            out.setdefault(e["name"], []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return out


def _inside(inner: tuple[float, float], outers: list[tuple[float, float]]) -> bool:
    return any(a <= inner[0] and inner[1] <= b for a, b in outers)


def test_module_scopes_gives_back_what_it_patched() -> None:
    model = _gpt2()
    ce = torch.nn.functional.cross_entropy
    with module_scopes(model):
        assert torch.nn.functional.cross_entropy is not ce
    assert torch.nn.functional.cross_entropy is ce
    assert "_loss_function" not in vars(model)  # transformers' own loss again, through its property

    def mine(*args: object, **kwargs: object) -> torch.Tensor:
        return torch.zeros(())

    model.loss_function = mine  # a user's own loss stays theirs
    with module_scopes(model):
        assert model.loss_function is not mine
    assert model.loss_function is mine


def test_loss_scope_keeps_the_result_and_does_not_nest_in_itself() -> None:
    model = _gpt2().eval()  # no dropout: the two losses are comparable
    x = torch.randint(0, 128, (B, T))
    want = model(input_ids=x, labels=x).loss
    with torch.profiler.profile() as prof, module_scopes(model):
        got = model(input_ids=x, labels=x).loss
    assert torch.equal(got, want)
    names = [e.name for e in prof.events()]
    assert names.count("lmprof:loss") == 1  # transformers' loss_function, its cross_entropy inside not again
    assert names.count("lmprof:model_glue") == 1


def _train_gpt2(out: Path, clip: bool = False) -> Path:
    """Six steps of a tiny GPT-2 under lmprof.profile (two profiled); the run folder."""
    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 128, (B, T))
    with lmprof.profile(model, out=out, warmup=1, steps=2, profile_steps=2, report=False, verbose=False) as prof:
        for _ in range(6):
            model(input_ids=x, labels=x).loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            prof.step()
    assert prof.folder is not None
    return prof.folder


def test_user_training_loop_rows_nest_in_their_phases(tmp_path: Path) -> None:
    folder = _train_gpt2(tmp_path)
    ranges = _ranges(folder)
    forward = ranges["lmprof:forward"]
    assert ranges["lmprof:model_glue"] and all(_inside(r, forward) for r in ranges["lmprof:model_glue"])
    # transformers computes the loss inside the model's forward: its operators run in a loss range
    # inside model_glue's (the loss range after the forward is the one lmprof opens for the user's loss code)
    ce = ranges["aten::cross_entropy_loss"]
    inner = [r for r in ranges["lmprof:loss"] if any(_inside(c, [r]) for c in ce)]
    assert len(inner) == len(ce) and all(_inside(r, ranges["lmprof:model_glue"]) for r in inner)
    run = Run.load(folder)
    rows = {(b.name, b.phase) for b in run.blocks}
    assert {("model_glue", "forward"), ("loss", "forward"), ("loss", "backward"),
            ("autograd_engine", "backward")} <= rows, sorted(rows)
    assert ("other", "backward") not in rows  # every backward node has its forward op's block


def test_generation_rows_nest_in_prefill_and_decode(tmp_path: Path) -> None:
    model = _gpt2().eval()
    x = torch.randint(0, 128, (B, T))
    with lmprof.profile(model, out=tmp_path, infer=True, warmup=1, steps=1, profile_steps=1, report=False,
                        verbose=False) as prof:
        for _ in range(3):
            model.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=0)
            prof.step()
    assert prof.folder is not None
    ranges = _ranges(prof.folder)
    phases = ranges["lmprof:prefill"] + ranges["lmprof:decode"]
    assert len(ranges["lmprof:model_glue"]) == 4  # one per forward: the prefill and 3 decode steps
    assert all(_inside(r, phases) for r in ranges["lmprof:model_glue"])
    assert "lmprof:loss" not in ranges


def test_a_replacement_made_inside_the_window_is_kept() -> None:
    """A script that swaps cross_entropy while lmprof's scopes are on keeps its swap afterwards."""
    model = _gpt2()
    ce = torch.nn.functional.cross_entropy

    def theirs(*args: object, **kwargs: object) -> torch.Tensor:
        return ce(*args, **kwargs)  # type: ignore[arg-type]

    try:
        with module_scopes(model):
            torch.nn.functional.cross_entropy = theirs
        assert torch.nn.functional.cross_entropy is theirs
    finally:
        torch.nn.functional.cross_entropy = ce


class _GlueModel(torch.nn.Module):
    """Work added in the model's own forward, outside its modules, timed by the model itself."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)
        self.x, self.buf = torch.randn(8, 64, 64), torch.zeros(8, 64, 64)
        self.work_s: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        h = self.inp(x)
        t = time.perf_counter()
        with torch.no_grad():  # in place, preallocated: no autograd node, no allocation
            for _ in range(200):
                self.buf.mul_(0.5).add_(self.x)
        self.work_s.append(time.perf_counter() - t)
        return self.out(h)


def test_work_in_the_models_own_forward_is_model_glue(tmp_path: Path) -> None:
    """model_glue holds the work added in the model's forward outside its modules: equal, within 20%,
    to the model's own stopwatch around that work (most samples from lmprof's clean steps, profiler
    off). A busy machine gets three attempts, as the doubling tests do."""
    errors = []
    from lmprof.measure.profiler_cost import event_cost

    for attempt in range(3):
        if attempt:  # a retry is a new run: the profiler's cost is measured again too
            event_cost(refresh=True)
        model = _GlueModel()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 64)
        with lmprof.profile(model, out=tmp_path / str(attempt), warmup=2, steps=8, profile_steps=2, report=False,
                            verbose=False) as prof:
            for _ in range(20):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
        assert prof.run is not None
        glue = sum(b.time_ms for b in prof.run.blocks if b.name == "model_glue" and b.phase == "forward")
        truth = 1e3 * sorted(model.work_s)[len(model.work_s) // 2]
        errors.append(glue / truth - 1)
        if abs(errors[-1]) <= 0.2:
            return
    pytest.fail(f"model_glue vs the model's own stopwatch: {[f'{e:+.0%}' for e in errors]}")


def test_a_model_with_an_unknown_loss_type_is_left_alone(capfd: pytest.CaptureFixture[str]) -> None:
    """transformers warns on stderr when its loss_function property is read for a loss_type it does not
    know: lmprof does not read it then, so the user's stderr stays theirs."""
    model = _gpt2()
    model.loss_type = "NotALoss"
    capfd.readouterr()
    with module_scopes(model):
        assert "_loss_function" not in vars(model)
    assert "loss_type" not in capfd.readouterr().err


def test_gradient_clipping_is_its_own_step_row(tmp_path: Path) -> None:
    """A loop that clips (nanoGPT, the HF Trainer and Lightning do by default) gets a grad_clip row: the
    clip's own operators (the norms) run inside its range, and clip_grad_norm_ is the user's again after."""
    before = torch.nn.utils.clip_grad_norm_
    folder = _train_gpt2(tmp_path, clip=True)
    assert torch.nn.utils.clip_grad_norm_ is before
    ranges = _ranges(folder)
    assert len(ranges["lmprof:grad_clip"]) == 2 + 1  # the profiled steps and the figures step
    norms = [r for name, rs in ranges.items() if name in ("aten::linalg_vector_norm", "aten::norm") for r in rs]
    assert norms and all(_inside(r, ranges["lmprof:grad_clip"]) for r in norms)
    rows = {(b.name, b.phase) for b in Run.load(folder).blocks}
    assert ("grad_clip", "step") in rows, sorted(rows)
