"""Rewrite README.md's command outputs from real runs of the commands, so they cannot go stale.

A block to regenerate is marked by a comment on the line before its fence:

    <!-- output: lmprof train | keep: ^lmprof train=2, ^Figures=7, ^Where the step=5 -->
    ```
    ... (replaced)
    ```

The command runs in a scratch folder with this checkout's ``.venv/bin`` first on PATH (``{repo}`` in it is
this checkout), stdout and stderr together, as a reader's terminal would show them when piped (120
columns). ``keep`` picks sections, each ``RE=N`` (the first line matching RE and the lines after it, N
in all) or ``RE..END`` (from the first line matching RE to the first one after it matching END), a
trailing ``?`` for a section the output may lack (a table a run prints only when it has the figures),
with ``...`` between sections that do not touch; without it, the whole output. ``$ <command>`` opens the
block unless the marker says ``echo: no``. Progress lines are left out (``LMPROF_PROGRESS=0``).

    python scripts/readme_outputs.py               # run every marked command, rewrite README.md
    python scripts/readme_outputs.py --only infer  # the commands containing "infer"
    python scripts/readme_outputs.py --list        # show the marked commands, run nothing

A command that fails stops the script (exit 1) with its output, and README.md is left as it was.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- output: (?P<body>.*?) -->$")


@dataclass(frozen=True)
class Section:
    """``start=N`` (``count`` lines) or ``start..end`` (``end`` set)."""

    start: re.Pattern[str]
    count: int = 0
    end: re.Pattern[str] | None = None
    optional: bool = False


@dataclass
class Block:
    """A marked output block: its marker's line index, the fence lines' indices, and what to run."""

    marker: int
    start: int  # the opening fence
    end: int  # the closing fence
    command: str
    keep: list[Section]
    echo: bool


def parse_marker(body: str) -> tuple[str, list[Section], bool]:
    """``cmd | keep: RE=N, RE..END | echo: no`` -> (cmd, sections, echo)."""
    command, *options = [part.strip() for part in body.split(" | ")]
    keep: list[Section] = []
    echo = True
    for option in options:
        name, _, value = option.partition(":")
        if name.strip() == "keep":
            for item in value.split(","):
                item = item.strip()
                optional = item.endswith("?")
                item = item.removesuffix("?")
                if ".." in item:
                    start, _, end = item.partition("..")
                    keep.append(Section(re.compile(start), end=re.compile(end), optional=optional))
                else:
                    pattern, _, count = item.rpartition("=")
                    keep.append(Section(re.compile(pattern), int(count), optional=optional))
        elif name.strip() == "echo":
            echo = value.strip() != "no"
        else:
            raise SystemExit(f"unknown marker option {name!r} in {body!r}")
    return command, keep, echo


def find_blocks(lines: list[str]) -> list[Block]:
    """Every marked block of the README, in order."""
    blocks = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise SystemExit(f"README line {i + 1}: a marker must stand right before a fenced block")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        command, keep, echo = parse_marker(m["body"])
        blocks.append(Block(i, i + 1, end, command, keep, echo))
    return blocks


def _first(output: list[str], pattern: re.Pattern[str], after: int = 0) -> int | None:
    return next((i for i in range(after, len(output)) if pattern.search(output[i])), None)


def _missing(pattern: re.Pattern[str], output: list[str]) -> SystemExit:
    return SystemExit(f"no output line matches {pattern.pattern!r}:\n" + "\n".join(output))


def select(output: list[str], keep: list[Section]) -> list[str]:
    """The sections ``keep`` names, in output order, ``...`` between those that do not touch."""
    if not keep:
        return output
    spans = []
    for section in keep:
        at = _first(output, section.start)
        if at is None:
            if section.optional:
                continue
            raise _missing(section.start, output)
        end = at + section.count
        if section.end is not None:
            last = _first(output, section.end, at + 1)
            if last is None:
                raise _missing(section.end, output)
            end = last + 1
        spans.append((at, min(end, len(output))))
    out: list[str] = []
    last = None
    for a, b in sorted(spans):
        if last is not None and a > last:
            out.append("...")
        out += output[max(a, last or 0):b]
        last = max(b, last or 0)
    return out


def run(command: str, scratch: Path) -> list[str]:
    """The command's output lines, trailing spaces removed (rich pads table cells)."""
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "LMPROF_PROGRESS": "0", "COLUMNS": "120", "TERM": "dumb"}
    proc = subprocess.run(command.replace("{repo}", str(ROOT)), shell=True, cwd=scratch, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    if proc.returncode not in (0,):
        print("\n".join(lines), file=sys.stderr)
        raise SystemExit(f"`{command}` exited {proc.returncode}: README.md left as it was")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the marked commands and rewrite their blocks; 0 when done."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("readme", nargs="?", type=Path, default=ROOT / "README.md")
    ap.add_argument("--only", help="only the commands containing this text")
    ap.add_argument("--list", action="store_true", help="list the marked commands and run nothing")
    args = ap.parse_args(argv)
    lines = args.readme.read_text(encoding="utf-8").splitlines()
    blocks = [b for b in find_blocks(lines) if not args.only or args.only in b.command]
    if args.list:
        for b in blocks:
            print(f"line {b.marker + 1}: {b.command}")
        return 0
    with tempfile.TemporaryDirectory(prefix="lmprof-readme-") as scratch:
        for b in reversed(blocks):  # from the end: earlier indices stay right
            print(f"running: {b.command}", file=sys.stderr, flush=True)
            shown = select(run(b.command, Path(scratch)), b.keep)
            head = [f"$ {b.command.replace('{repo}/', '')}"] if b.echo else []
            lines[b.start + 1:b.end] = head + shown
    text = "\n".join(lines) + "\n"
    tmp = args.readme.with_name(f".{args.readme.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, args.readme)  # atomically: a reader never sees half a README
    print(f"rewrote {len(blocks)} block(s) of {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
