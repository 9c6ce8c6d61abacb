"""The one Mode: its traits against the vocabulary, and the catalogue's picks by mode."""
from __future__ import annotations

from typing import get_args

import pytest

from lmprof.modes import MODES, Mode, traits
from lmprof.names import PASS_PHASES, PHASES
from lmprof.record.catalogue import CATALOGUE, Role, pick


def test_the_modes_are_the_strings_run_json_keeps() -> None:
    assert MODES == get_args(Mode) == ("train", "infer")
    with pytest.raises(ValueError, match="'train' or 'infer'"):
        traits("eval")


@pytest.mark.parametrize("mode", MODES)
def test_a_modes_passes_cover_its_phases(mode: str) -> None:
    t = traits(mode)
    assert t.trains != t.generates
    covered = tuple(p for name in t.passes for p in PASS_PHASES[name])
    assert covered == t.phases and set(t.phases) <= set(PHASES)


@pytest.mark.parametrize("role", get_args(Role))
def test_every_role_has_one_figure_per_mode(role: str) -> None:
    for mode in MODES:
        spec = pick(role, mode)  # type: ignore[arg-type]
        assert spec.role == role and mode in spec.modes
        assert [m.name for m in CATALOGUE if m.role == role and mode in m.modes] == [spec.name]
    assert pick("timing", "train").name == "step_time" and pick("timing", "infer").name == "e2e_latency"
