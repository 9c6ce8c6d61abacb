"""A user's generation carries lmprof's hooks that mark each forward's end; where a token takes little time,
the run says what that costs its figures.

The cost (45-70 us a forward on a 2-core CPU) was measured with benchmarks/generation_overhead.py: the
lecture's decode loop by its own stopwatch inside lmprof's clean window against the same loop without
lmprof (docs/user-code.md). Here the note's arithmetic is checked by hand against the run's own TPOT; the
note is absent where no hook marks the forwards (`lmprof infer`'s own loop) and where a token takes long.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import lmprof
from lmprof.config import InferConfig
from lmprof.pipeline.infer import run_inference
from lmprof.pipeline.protocol.finish.assemble import MARK_COST_US, marks_note
from lmprof.record.run import Run

tf = pytest.importorskip("transformers")


def _marks(notes: list[str]) -> list[str]:
    return [n for n in notes if n.startswith("lmprof's hooks marked each forward's end")]


def test_a_users_decode_loop_of_short_forwards_is_told_what_the_marks_cost(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64)).eval()
    prompt = torch.randint(0, 512, (1, 6))
    with lmprof.profile(model, out=tmp_path, infer=True, report=False, verbose=False) as prof:
        for _ in range(8):
            ids = prompt
            with torch.no_grad():
                for _ in range(6):
                    ids = torch.cat([ids, model.forward(ids).logits[:, -1:].argmax(-1)], dim=1)
            prof.step()
    run = Run.load(prof.folder)
    tpot = run.value("tpot")
    assert tpot is not None
    (note,) = _marks(run.notes)
    low, high = (round(100 * us / 1e3 / tpot) for us in MARK_COST_US)  # by hand: the cost over the run's TPOT
    assert f"{low}-{high}% of this TPOT of {tpot:.3g} ms" in note, (note, tpot)


def test_lmprofs_own_loop_has_no_hooks_to_tell_of(tmp_path: Path) -> None:
    run, _ = run_inference(InferConfig(batch_size=1, prompt_len=6, new_tokens=6, steps=2, warmup=1, profile_steps=1,
                                       device="cpu", energy="off"), out_dir=tmp_path)
    assert run.value("tpot") is not None and run.value("tpot") < 3.5  # short enough that hooks would be said
    assert not _marks(run.notes)


@pytest.mark.parametrize("tpot_ms, said", [(0.5, True), (3.0, True), (3.6, False), (40.0, False), (0.0, False),
                                            (float("nan"), False), (float("inf"), False)])
def test_the_note_is_said_where_the_marks_may_be_two_percent_of_a_token_or_more(tpot_ms: float, said: bool) -> None:
    notes = marks_note(tpot_ms)
    assert bool(notes) is said
    if said:
        shares = re.search(r"(\d+)-(\d+)% of this TPOT", notes[0])
        assert shares and (int(shares[1]), int(shares[2])) == tuple(round(100 * us / 1e3 / tpot_ms) for us in MARK_COST_US)
