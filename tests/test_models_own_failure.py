"""A model that fails on its own under `lmprof train` / `lmprof infer` is one line, exit 2; a failure that
does not happen without lmprof keeps its traceback (it is lmprof's bug).

The truth is the model itself: the same step run plainly, after the session is gone. Here the model's
forward is replaced by one that fails every time (the model's fault), or only on one call (a failure
a plain re-run does not reproduce, so not the model's).
"""
from __future__ import annotations

from typing import Callable

import pytest

from lmprof.errors import LmprofError, WorkloadError
from lmprof.pipeline.protocol.own_loop import the_models_own_failures
from tests.conftest import one_line_error

pytest.importorskip("transformers")

COUNTS = ("--steps", "1", "--warmup", "1", "--profile-steps", "1", "--device", "cpu", "--energy", "off")


def test_a_failure_the_plain_step_repeats_is_the_models() -> None:
    ran = []

    def again() -> None:
        ran.append(1)
        raise RuntimeError("size mismatch in the model\nsecond line")

    with pytest.raises(WorkloadError) as info:
        with the_models_own_failures(again, "training step"):
            raise RuntimeError("size mismatch in the model")
    assert ran == [1]
    assert str(info.value) == ("the model's training step fails again run plainly, with no profiler or hooks (RuntimeError: size mismatch in "
                               "the model): the model or its settings, not the measurement")
    assert isinstance(info.value.__cause__, RuntimeError)  # the failure under lmprof, kept for a debugger


def test_a_failure_the_plain_step_does_not_repeat_keeps_its_own_error() -> None:
    original = KeyError("lmprof's hook")
    with pytest.raises(KeyError) as info:
        with the_models_own_failures(lambda: None, "training step"):
            raise original
    assert info.value is original


@pytest.mark.parametrize("exc", [LmprofError("a refusal"), MemoryError(), RuntimeError("CUDA out of memory"),
                                 KeyboardInterrupt()])
def test_refusals_out_of_memory_and_interrupts_pass_untouched_and_nothing_runs_again(exc: BaseException) -> None:
    def again() -> None:
        raise AssertionError("the step must not run again")

    with pytest.raises(type(exc)) as info:
        with the_models_own_failures(again, "generation"):
            raise exc
    assert info.value is exc


def test_an_out_of_memory_on_the_plain_step_leaves_the_first_error() -> None:
    def again() -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    with pytest.raises(ValueError, match="first"):
        with the_models_own_failures(again, "generation"):
            raise ValueError("first")


def test_a_long_message_is_cut_after_a_sentence() -> None:
    def again() -> None:
        raise RuntimeError("The tensor was modified in place. " + "x" * 300)

    with pytest.raises(WorkloadError, match=r"\(RuntimeError: The tensor was modified in place\.\): the model"):
        with the_models_own_failures(again, "training step"):
            raise RuntimeError("under lmprof")


def _broken_forward(monkeypatch: pytest.MonkeyPatch, fails: Callable[[int], bool]) -> list[int]:
    import transformers.models.gpt2.modeling_gpt2 as gpt2

    calls: list[int] = []
    real = gpt2.GPT2Model.forward

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if fails(len(calls)):
            raise ValueError("the model's own bug")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(gpt2.GPT2Model, "forward", forward)
    return calls


@pytest.mark.parametrize("verb, extra", [("train", ("--seq-len", "16", "-b", "2")),
                                         ("infer", ("--prompt-len", "8", "--new-tokens", "2"))])
def test_cli_says_in_one_line_when_the_model_fails_without_lmprof(cli, monkeypatch, tmp_path, verb, extra) -> None:
    calls = _broken_forward(monkeypatch, lambda n: True)
    code, _, err = cli(verb, "--hf-config", "tiny-gpt2", *COUNTS, *extra, "--out", tmp_path)
    what = "training step" if verb == "train" else "generation"
    line = one_line_error(code, err, f"the model's {what} fails again run plainly, with no profiler or hooks (ValueError: the model's own bug)")
    assert "not the measurement" in line
    assert len(calls) == 2  # the failing call under lmprof, and the plain one that fails again


def test_cli_keeps_the_traceback_when_a_plain_step_runs(cli, monkeypatch, tmp_path) -> None:
    # Fails once, on the first measured call: the plain step afterwards runs, so the failure is not the model's.
    calls = _broken_forward(monkeypatch, lambda n: n == 2)
    with pytest.raises(ValueError, match="the model's own bug"):
        cli("train", "--hf-config", "tiny-gpt2", *COUNTS, "--seq-len", "16", "-b", "2", "--out", tmp_path)
    assert len(calls) == 3


def test_infer_keeps_the_traceback_when_transformers_generate_runs_what_lmprofs_loop_cannot(cli, monkeypatch,
                                                                                          tmp_path) -> None:
    # The referee of a generation is transformers' own generate(): a failure of lmprof's cache driver alone
    # is lmprof's, not the model's.
    from lmprof.workloads.decoding import HFDecoder

    def step(self, token):  # type: ignore[no-untyped-def]
        raise IndexError("lmprof's cache driver")

    monkeypatch.setattr(HFDecoder, "step", step)
    with pytest.raises(IndexError, match="cache driver"):
        cli("infer", "--hf-config", "tiny-gpt2", *COUNTS, "--prompt-len", "8", "--new-tokens", "2", "--out", tmp_path)
