"""An optimizer the loop never steps is not the one whose steps are the loop's steps.

Before, ``lmprof run`` took the largest live optimizer at the first step as the loop's: one created and left
(a leftover AdamW over a model the loop never runs) was chosen, never stepped, and the run measured nothing,
saying the script stepped no optimizer. Truth: the script's own stopwatch around each pass of its loop.
"""
from __future__ import annotations

import statistics

import pytest

LOOP = """
import json, sys, time
import torch
torch.manual_seed(0)
big = torch.nn.Linear(256, 256)
left = torch.optim.AdamW(big.parameters())  # created and left: never stepped{forward_note}
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
spent = []
for i in range(24):
    began = time.perf_counter()
{forward}    model(torch.randn(4, 8)).sum().backward()
    time.sleep(0.003)
    opt.step()
    opt.zero_grad()
    spent.append((time.perf_counter() - began) * 1e3)
json.dump(spent, open(sys.argv[1], "w"))
"""


def test_a_larger_optimizer_left_unused_does_not_take_the_loops_steps(run_script) -> None:
    done = run_script(LOOP.format(forward_note="", forward=""))
    record, own_ms = done.record, done.own
    assert done.code == 0 and record is not None, done.err
    assert record["metrics"]["params"]["value"] == 8 * 16 + 16 + 16 * 8 + 8  # the loop's model, not the leftover
    # The script's own stopwatch around the same passes: SGD's second step (the re-choice) ends the first of 3
    # warm-up steps, which began with the session; passes 2 and 3 are the others, then the 10 clean ones
    truth = statistics.median(own_ms[4:14])
    assert record["metrics"]["step_time"]["value"] == pytest.approx(truth, rel=0.25), (record["metrics"]["step_time"],
                                                                                       own_ms)
    (note,) = [n for n in record["notes"] if "never stepped" in n]
    assert note.startswith("AdamW (65,792 params)") and "SGD stepped twice" in note
    assert not any("2 optimizers" in n for n in record["notes"])  # the first choice's notes were taken back


def test_a_larger_optimizer_whose_model_runs_but_never_steps_is_said_by_name(run_script) -> None:
    """Its model ran forwards (a frozen teacher with an optimizer made for it): it might be the loop's, so it
    stays chosen, and the run that measured nothing says why, with the optimizers' names and steps."""
    body = LOOP.format(forward_note="; its model runs",
                       forward="    with torch.no_grad():\n        big(torch.randn(4, 256))\n")
    done = run_script(body)
    assert done.code == 0 and done.record is None
    assert "never stepped, while others did (SGD: 24 steps)" in done.err and "AdamW (65,792 params)" in done.err, done.err
    assert "without stepping a torch.optim optimizer" not in done.err


CRITIC = """
import json, sys, time
import torch
torch.manual_seed(0)
gen = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
critic = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4)
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4)
spent = []
for i in range(20):
    began = time.perf_counter()
    for _ in range(3):  # WGAN's n_critic: the critic steps three times for each step of the generator
        fake = gen(torch.randn(8, 16)).detach()
        (critic(fake).mean() - critic(torch.randn(8, 16)).mean()).backward()
        opt_c.step()
        opt_c.zero_grad()
    (-critic(gen(torch.randn(8, 16))).mean()).backward()
    time.sleep(0.003)
    opt_g.step()
    opt_g.zero_grad()
    opt_c.zero_grad()
    spent.append((time.perf_counter() - began) * 1e3)
json.dump(spent, open(sys.argv[1], "w"))
"""


def test_a_generator_chosen_while_its_critic_steps_first_stays_the_loops(run_script) -> None:
    """The generator's optimizer (the largest) has not stepped when the critic's steps twice, but the generator
    ran forwards for the critic's input: it is the loop's, and a step is one pass of the outer loop."""
    done = run_script(CRITIC)
    record, own_ms = done.record, done.own
    assert done.code == 0 and record is not None, done.err
    assert record["metrics"]["params"]["value"] == 16 * 128 + 128 + 128 * 16 + 16  # the generator
    # the clean steps' passes: the first pass ends the first of 3 warm-up steps (which began with the session)
    truth = statistics.median(own_ms[3:13])
    assert record["metrics"]["step_time"]["value"] == pytest.approx(truth, rel=0.25), (record["metrics"]["step_time"],
                                                                                       own_ms)
    assert not any("never stepped" in n for n in record["notes"])


def test_one_pass_says_it_is_too_few_to_tell(run_script) -> None:
    """One pass of the loop: the leftover is still the choice (nothing tells it apart yet), and the message
    says so, rather than that no optimizer stepped."""
    body = LOOP.format(forward_note="", forward="").replace("range(24)", "range(1)")
    done = run_script(body)
    assert done.code == 0 and done.record is None
    assert "while others did (SGD: 1 step); one pass of the loop is too few" in done.err, done.err
