"""One table of defaults (lmprof/counts.py) that every entry point, its --help and the docs read.

Truth: the table in docs/user-code.md, written for readers; each door is asked what it would run.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from lmprof.config import InferConfig, TrainConfig
from lmprof.counts import DEFAULT_COUNTS, Counts


def _documented() -> dict[str, Counts]:
    text = (Path(__file__).resolve().parents[1] / "docs" / "user-code.md").read_text()
    table = text.split("<!-- defaults: lmprof.counts.DEFAULT_COUNTS -->", 1)[1]
    rows = re.findall(r"^\| (train|infer) \| (\d+) \| (\d+) \| (\d+) \|$", table.split("\n\n", 1)[0], re.M)
    return {mode: Counts(int(w), int(s), int(p)) for mode, w, s, p in rows}


def test_the_docs_state_the_table():
    assert _documented() == DEFAULT_COUNTS


def test_every_door_runs_the_table_when_no_count_is_given():
    from lmprof.api import profile_inference, profile_training
    from lmprof.pipeline.protocol.spec import Spec

    for mode, cfg in (("train", TrainConfig()), ("infer", InferConfig())):  # lmprof train / infer
        assert Counts(cfg.warmup, cfg.steps, cfg.profile_steps) == DEFAULT_COUNTS[mode]
        assert Spec(mode=mode).counts() == DEFAULT_COUNTS[mode]  # lmprof run, lmprof.profile(), the callbacks
    for fn in (profile_training, profile_inference):  # the Python API: None means the table's
        params = inspect.signature(fn).parameters
        assert all(params[name].default is None for name in Counts._fields), fn.__name__


@pytest.mark.parametrize("verb", ["train", "infer", "run"])
def test_the_help_prints_the_table(verb, capsys):
    from lmprof.cli.main import main

    assert main([verb, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    modes = ("train", "infer") if verb == "run" else (verb,)
    for mode in modes:
        for value in DEFAULT_COUNTS[mode]:
            assert f"[default: {value}]" in text, (verb, mode, value)


# The counts each door takes, written here by hand: no warm-up is a choice, no profiled step is not,
# and no clean window only where the door times from the profiled steps (a user's script; the built-in
# loops and their sweeps always run one). Above 2**62 no clock could finish.
_ALLOWED = {"warmup": (0, 0), "steps": (1, 0), "profile_steps": (1, 1)}  # fewest: (built-in, script)


@pytest.mark.parametrize("field", sorted(_ALLOWED))
def test_every_door_refuses_the_same_counts(field: str) -> None:
    from lmprof.config import build
    from lmprof.errors import LmprofError
    from lmprof.pipeline.usercode.guard import check_counts
    from lmprof.sweep.spec import parse_spec

    def refused(check, value: int) -> bool:
        try:
            check(value)
        except LmprofError:
            return True
        return False

    built_in = [lambda v: build(TrainConfig, {field: v}), lambda v: build(InferConfig, {field: v}),
                lambda v: parse_spec({field: v})]
    script = [lambda v: parse_spec({"script": __file__, field: v}),
              lambda v: check_counts(**{"warmup": None, "steps": None, "profile_steps": None, field: v}, flags=True)]
    for doors, fewest in ((built_in, _ALLOWED[field][0]), (script, _ALLOWED[field][1])):
        for check in doors:
            assert [refused(check, v) for v in (fewest - 1, fewest, 2**62, 2**62 + 1, -10**40)] == \
                [True, False, False, True, True], (field, fewest)
