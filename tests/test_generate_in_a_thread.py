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


LOOP_IN_A_THREAD = """
import threading, torch


def train():  # a training loop a web app or a notebook runs in a worker thread: every step in that one thread
    m = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(12):
        m(torch.randn(8, 32)).sum().backward()
        opt.step()
        opt.zero_grad()


t = threading.Thread(target=train)
t.start()
t.join()
"""


def test_a_training_loop_in_one_worker_thread_gets_its_profiled_window(run_script) -> None:
    """The main-thread rule above refused every window outside the main thread: a loop run whole in a worker
    thread got its blocks from the first-call figures step instead ("+443%" over the clean step). Its steps all
    begin in one thread, where the window starts and stops; the streamed generations above (a thread each) are
    still refused."""
    r = run_script(LOOP_IN_A_THREAD, "--warmup", "1", "--steps", "2", "--profile-steps", "2")
    assert r.code == 0 and r.record is not None, r.err
    assert not any("no profiled window" in n or "figures step" in n for n in r.record["notes"]), r.record["notes"]
    assert r.record["metrics"]["profiled_step_time"]["n"] == 2
    rows = r.rows()
    assert {("0", "forward"), ("2", "forward"), ("0", "backward"), ("2", "backward")} <= set(rows), rows
