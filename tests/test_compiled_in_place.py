"""Models compiled in place, not wrapped: ``model.forward = torch.compile(model.forward)`` (Hugging Face's
static-cache generation recipe), ``generate()``'s own compilation of the model's call (a static cache on
CUDA), and ``Module.compile()`` on each layer (torchtitan's way).

lmprof placed its block hooks inside such a model, where dynamo traces them: a ``generate()`` loop under
lmprof compiled 85 frames where it compiles 3 alone, hit dynamo's recompile limit (warnings on the user's
stderr) and ran the rest eagerly, so what was timed was not the user's program; per-layer compilation
got no FLOPs. The truth is dynamo's own count of frames compiled, and the same loop's output alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

import lmprof
from lmprof.cli.main import main
from lmprof.record.run import Run

tf = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=128, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0)
    return tf.AutoModelForCausalLM.from_config(cfg)


def _frames(run: Callable[[], object]) -> tuple[int, object]:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    out = run()
    return counters["frames"]["total"], out


SCRIPT = """
import json, sys
import torch, torch._dynamo, transformers as tf
from torch._dynamo.utils import counters

torch._dynamo.reset()
counters.clear()
torch.manual_seed(0)
cfg = tf.GPT2Config(n_layer=1, n_head=2, n_embd=64, vocab_size=128, n_positions=128, bos_token_id=0,
                    eos_token_id=0, pad_token_id=0)
model = tf.AutoModelForCausalLM.from_config(cfg).eval()
kw = {}
if sys.argv[2] == "forward":  # Hugging Face's recipe: the forward compiled in place
    model.forward = torch.compile(model.forward, backend="eager")
else:  # generate() compiles the model's whole call itself, for a static cache (on CUDA; here asked for)
    kw["compile_config"] = tf.CompileConfig(backend="eager", mode=None)
    kw["compile_config"]._compile_all_devices = True
    kw["cache_implementation"] = "static"
x = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
tokens = [model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=4, min_new_tokens=4,
                         do_sample=False, **kw)[:, -4:].tolist() for _ in range(5)]
json.dump([counters["frames"]["total"], tokens], open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("how", ["forward", "generate"])
def test_a_generate_loop_that_compiles_compiles_as_alone(tmp_path: Path, how: str) -> None:
    """``lmprof run --infer`` learns the model from generate(): compiled in place there too, or compiled by
    generate() itself, whose compiled call has the model's own hooks inside it (those of lmprof's that
    remain run outside dynamo's tracing)."""
    import json
    import runpy
    import sys

    script = tmp_path / "gen.py"
    script.write_text(SCRIPT)
    argv = sys.argv
    try:
        sys.argv = [str(script), str(tmp_path / "alone.json"), how]
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    assert main(["run", "--infer", "--warmup", "1", "--steps", "2", "--profile-steps", "1", "--no-report", "--out",
                 str(tmp_path / "runs"), str(script), str(tmp_path / "seen.json"), how]) == 0
    alone, seen = (json.loads((tmp_path / f).read_text()) for f in ("alone.json", "seen.json"))
    assert seen == alone  # the old code: 84 frames against 3 (forward), 129 against 1 (generate); the limit hit
    run = Run.load(next((tmp_path / "runs").iterdir()))
    assert run.value("compile.compilations") == alone[0]  # lmprof knew the model runs compiled code


def _layers_compiled() -> torch.nn.Module:
    model = _gpt2()
    for block in model.transformer.h:
        block.compile(backend="eager")
    return model


def _train(model: torch.nn.Module, steps: int, prof: object = None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for i in range(steps):
        x = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(i))
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if prof is not None:
            prof.step()  # type: ignore[attr-defined]
    return losses


def test_a_model_compiled_layer_by_layer_compiles_as_alone_and_has_its_flops(tmp_path: Path) -> None:
    alone, losses = _frames(lambda: _train(_layers_compiled(), 14))
    holder: dict[str, Path] = {}

    def profiled() -> list[float]:
        model = _layers_compiled()
        with lmprof.profile(model, out=tmp_path / "runs", report=False, verbose=False) as prof:
            out = _train(model, 14, prof)
        holder["folder"] = Path(prof.folder)
        return out

    seen, profiled_losses = _frames(profiled)
    assert (seen, profiled_losses) == (alone, losses)
    run = Run.load(holder["folder"])
    assert run.value("tokens_per_step") == 32
    assert run.value("flops.model_per_step")  # its shape, seen on the model's own call outside the compiled layers
