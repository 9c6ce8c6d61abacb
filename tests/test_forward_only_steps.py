"""Steps that only run forwards without grad (an evaluation or scoring loop under ``lmprof.profile()`` with
``prof.step()``): said as such, not as training steps that "also ran an evaluation", and FLOPs refused for
the reason that holds. Before: "10 of the 10 clean steps also ran the model without grad (an evaluation ...)"
and "no FLOP count: ... saw no input's shape (neither token ids nor embeddings reached a hook ...)", where
every forward's token ids reached the hook. Truth: the loop, which never calls backward."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmprof

tf = pytest.importorskip("transformers")


def test_a_scoring_loop_is_said_to_be_forwards_without_a_backward(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)).eval()
    with torch.no_grad(), lmprof.profile(model, out=tmp_path, warmup=1, steps=3, profile_steps=1, report=False,
                                         verbose=False) as prof:
        for _ in range(6):
            x = torch.randint(0, 64, (2, 16))
            model(input_ids=x, labels=x)
            prof.step()
    run = prof.run
    assert run is not None and run.value("step_time")
    notes = run.notes
    assert any(n.startswith("no step ran a backward: every forward of the model ran without grad") for n in notes)
    assert not any("also ran the model without grad" in n for n in notes)
    (flops,) = [n for n in notes if n.startswith("no FLOP count")]
    assert "no step ran a backward" in flops and "saw no input's shape" not in flops
