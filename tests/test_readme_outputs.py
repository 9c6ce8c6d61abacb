"""scripts/readme_outputs.py: its markers and section picking (the commands themselves are not run here)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_outputs", ROOT / "scripts" / "readme_outputs.py")
assert _spec is not None and _spec.loader is not None
readme_outputs = importlib.util.module_from_spec(_spec)
sys.modules["readme_outputs"] = readme_outputs
_spec.loader.exec_module(readme_outputs)


def test_sections_by_count_and_by_range() -> None:
    out = ["noise", "lmprof train — x", "batch 4", "NOISY RUN", " energy.total n/a", "gap", "Where", "w1", "w2"]
    command, keep, echo = readme_outputs.parse_marker("lmprof train | keep: ^lmprof train —..energy, ^Where=2 | echo: no")
    assert command == "lmprof train" and not echo
    assert readme_outputs.select(out, keep) == ["lmprof train — x", "batch 4", "NOISY RUN", " energy.total n/a",
                                                "...", "Where", "w1"]
    with pytest.raises(SystemExit, match="no output line matches"):
        readme_outputs.select(out, readme_outputs.parse_marker("x | keep: ^absent=1")[1])
    # A section the output may lack ("?"): left out when absent.
    assert readme_outputs.select(out, readme_outputs.parse_marker("x | keep: ^absent=1?, ^Where=1")[1]) == ["Where"]


def test_every_marker_of_the_readme_stands_before_a_block() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    blocks = readme_outputs.find_blocks(lines)
    assert len(blocks) >= 3 and all(lines[b.start].startswith("```") and b.end > b.start for b in blocks)
    assert any("lmprof infer --hf-config gpt2" in b.command for b in blocks)  # the lesson's output is real
