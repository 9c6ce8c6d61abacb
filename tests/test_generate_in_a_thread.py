"""``generate()`` in a thread of its own, as Hugging Face's streaming recipe runs it (``TextIteratorStreamer``:
the generation in a ``Thread``, the main thread reading the text as it comes).

Under ``lmprof run --infer`` the profiled window started in one generation's thread and stopped in the
next one's: torch's profiler must stop in the thread that started it, and the process died of a
segmentation fault (exit 139), after kineto printed an ERROR line on the user's stderr. Now the window
is not started outside the main thread (a note says so) and kineto's line is kept off. Truth: the
script's own output alone, and its exit code.
"""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.record.run import Run

pytest.importorskip("transformers")

SCRIPT = """
from threading import Thread
import torch, transformers as tf

torch.manual_seed(0)
cfg = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0,
                    pad_token_id=0)
model = tf.AutoModelForCausalLM.from_config(cfg).eval()


class Tok:  # what the streamer decodes with
    def decode(self, ids, **kw):
        return " ".join(map(str, ids))


for i in range(5):
    streamer = tf.TextIteratorStreamer(Tok(), skip_prompt=True)
    x = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(i))
    t = Thread(target=model.generate, kwargs=dict(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=6,
                                                  min_new_tokens=6, do_sample=False, streamer=streamer))
    t.start()
    print("".join(streamer).split())
    t.join()
"""


def test_a_streamed_generate_in_its_own_thread_runs_as_alone(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """In this process (a crash would fail the test as a lost worker): the script alone, then under
    ``lmprof run --infer``; captured at the file descriptors, where kineto writes."""
    script = tmp_path / "stream.py"
    script.write_text(SCRIPT)
    runpy.run_path(str(script), run_name="__main__")
    alone = capfd.readouterr().out
    assert main(["run", "--infer", "--no-report", "--warmup", "1", "--steps", "2", "--profile-steps", "1", "--out",
                 str(tmp_path / "runs"), str(script)]) == 0  # the old code: a segmentation fault
    seen = capfd.readouterr()
    assert seen.out == alone
    assert "External init callback" not in seen.err
    run = Run.load(next((tmp_path / "runs").iterdir()))
    assert run.value("ttft") and run.value("tpot")
    assert any(n.startswith("no profiled window: generation") and "main thread" in n for n in run.notes)
