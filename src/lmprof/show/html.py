"""The pieces of lmprof's self-contained HTML reports and the Jinja2 environment that renders them.

Reports are built in two steps: the report modules (run_report.py, sweep_report.py, trace_findings.py)
turn a run or a sweep into *parts* — the small typed values below (a table of cells, a figure, a
list, a note) — and the templates in ``templates/`` turn parts into HTML. Python never writes markup
and never escapes: the Jinja2 environment has autoescaping on for every template, so any text from a
record (a block name, a note, a file name) is shown as text, whatever it contains. The only values
marked safe are the rendered output of these templates themselves.

What a report may link or embed is decided here too: :func:`file_inside` (only files inside the run
or sweep folder), :func:`local_href` (percent-encoded relative links) and :class:`Embedder` (each PNG
once, bounded in size).
"""
from __future__ import annotations

import base64
import datetime as _dt
import math
import os
import re
import stat
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence, Union
from urllib.parse import quote

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pydantic's own dependency, so always installed
    from typing_extensions import dataclass_transform

from lmprof.show.format import number

REPORT_NAME = "report.html"
# The largest PNG a report embeds, and the most all of one report's embedded PNGs may add up to.
# lmprof's own plots are well under 1 MiB; a run folder someone sent may hold anything (a 1 GiB
# sparse "memory.png"), and base64 inflates it by a third in the page and several times in memory.
MAX_EMBED_BYTES = 16 << 20
MAX_EMBED_TOTAL = 64 << 20
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_TEMPLATES = Path(__file__).parent / "templates"
NOT_RECORDED = "not recorded in this run"

SOURCE_HELP = {
    "measured": "read from a clock or counter",
    "estimated": "from a model or formula",
    "derived": "arithmetic on measured figures",
}


# ================================================================================================
# Which files a report may link or embed
# ================================================================================================

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def file_inside(folder: str | Path | None, name: object) -> Path | None:
    """The file ``name`` names inside ``folder``, or None when ``name`` is anything but a plain relative
    path that stays there (a URL such as ``javascript:...``, an absolute path, ``..``, a symlink out).

    Everything a report links to or embeds from a run record or a store goes through here: the record
    may come from anyone, and only files of the run itself belong in its report.
    """
    if folder is None or not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        return None
    if _SCHEME.match(name) or name.startswith(("/", "~")) or ".." in Path(name).parts:
        return None
    base = Path(folder)
    try:
        target = (base / name).resolve()
        target.relative_to(base.resolve())
    except (OSError, ValueError, RuntimeError):
        return None
    return target


def local_href(target: Path, report_dir: str | Path) -> str:
    """A relative, percent-encoded link from ``report_dir`` to ``target`` (checked by :func:`file_inside`).

    Encoding every segment means no file name can turn into a scheme (``javascript%3A...``) or break
    out of the attribute.
    """
    try:
        rel = Path(os.path.relpath(target, Path(report_dir).resolve())).as_posix()
    except ValueError:  # different drives on Windows
        return target.as_uri()
    return quote(rel, safe="/")


# ================================================================================================
# Parts: what a report is made of (the templates draw each kind)
# ================================================================================================


@dataclass_transform(frozen_default=True)
class Part:
    """A piece of a report section, drawn by its kind (templates/parts.html.j2): each subclass is a
    frozen dataclass that names its kind, ``class Figure(Part, kind="figure")``."""

    kind: ClassVar[str]

    def __init_subclass__(cls, *, kind: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = kind
        dataclass(frozen=True)(cls)


@dataclass(frozen=True)
class Cell:
    """One table cell: text, drawn as ``style`` says.

    Styles: "" (plain), "code", "na" (a muted n/a), "note" (muted small text), "badge" (a measured /
    estimated / derived label; ``text`` is the source), "link" (``href`` from :func:`local_href`).
    ``sort`` is the raw value a sortable table sorts by.
    """

    text: str = ""
    style: str = ""
    href: str | None = None
    sort: str | None = None


CellLike = Union[Cell, str]


class Table(Part, kind="table"):
    """Rows of cells under headers; ``num`` are the right-aligned (numeric) columns.

    ``sortable`` makes it a click-to-sort table: numeric headers say so and cells carry their raw value.
    """

    headers: Sequence[str]
    rows: Sequence[Sequence[CellLike]]
    num: frozenset[int] = frozenset()
    cls: str = ""
    total_last: bool = False
    sortable: bool = False


class Figure(Part, kind="figure"):
    """An embedded PNG (a data URI) with its caption."""

    src: str
    caption: str
    alt: str


class Absent(Part, kind="absent"):
    """The line shown where a run has nothing (or a note why something is not shown)."""

    text: str = NOT_RECORDED


class Para(Part, kind="para"):
    """A paragraph of text; ``intro`` draws it muted, as a section's lead-in."""

    text: str
    intro: bool = False


class Bullets(Part, kind="bullets"):
    """A bulleted list of text."""

    items: Sequence[str]


class Heading(Part, kind="heading"):
    """A sub-heading inside a section."""

    text: str


class Details(Part, kind="details"):
    """Parts folded under a summary line (open on click)."""

    summary: str
    parts: Sequence[Any]


@dataclass(frozen=True)
class Card:
    """A headline figure: label, value (None: not available, ``sub`` says why) and its spread."""

    label: str
    value: str | None
    sub: str
    key: str
    source: str | None = None
    note: str | None = None
    # What makes the figure less than a clean median: "noisy run", "first call, not a clean median".
    marks: Sequence[str] = ()


class Cards(Part, kind="cards"):
    """The row of headline cards."""

    cards: Sequence[Card]


@dataclass(frozen=True)
class Rec:
    """One recommendation: what, why, what to try, the evidence and notes."""

    rule: str
    title: str
    why: str
    actions: Sequence[str]
    evidence: Sequence[str]
    notes: Sequence[str]


class Recs(Part, kind="recs"):
    """The recommendations panel."""

    recs: Sequence[Rec]


class TraceLink(Part, kind="trace_link"):
    """The link to the run's trace and how to open it."""

    href: str
    name: str
    size: str


@dataclass(frozen=True)
class Section:
    """A report section with an anchor id (the navigation links to it)."""

    sid: str
    title: str
    parts: Sequence[Any]
    intro: str | None = None
    nav: str = ""


def table(headers: Sequence[str], rows: Iterable[Sequence[CellLike]], *, num: Iterable[int] = (), cls: str = "",
          total_last: bool = False, sortable: bool = False) -> Table:
    """A :class:`Table` (rows taken as a list)."""
    return Table(list(headers), [list(r) for r in rows], frozenset(num), cls, total_last, sortable)


def png_data_uri(data: bytes) -> str:
    """``data:image/png;base64,...`` for embedding."""
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def figure(data: bytes, caption: str, alt: str | None = None) -> Figure:
    """An embedded PNG with a caption."""
    return Figure(png_data_uri(data), caption, alt or caption)


class Embedder:
    """Embeds a report's PNG files: each distinct file (by real path) once, each at most
    :data:`MAX_EMBED_BYTES`, all together at most :data:`MAX_EMBED_TOTAL`; anything else is a note."""

    def __init__(self) -> None:
        self.seen: set[str] = set()  # real paths embedded (or refused) so far
        self.names: set[str] = set()  # names as the record lists them, for callers that claim files
        self.total = 0

    def png(self, path: Path, caption: str, name: str | None = None) -> Figure | Absent | None:
        """A figure for ``path``, None when this file was embedded already, or a one-line note why not."""
        label = name or path.name
        try:
            real = os.path.realpath(path)
        except (OSError, ValueError):
            return Absent(f"{label}: cannot be read, not shown")
        if real in self.seen:
            return None  # the same file listed again (another spelling, a link): shown once
        self.seen.add(real)
        try:
            with open(real, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    return Absent(f"{label}: not a regular file, not shown")
                if st.st_size > MAX_EMBED_BYTES:
                    return Absent(f"{label}: {st.st_size:,} bytes, more than the {MAX_EMBED_BYTES >> 20} MiB "
                                  "a report embeds; not shown (open the file itself)")
                if self.total + st.st_size > MAX_EMBED_TOTAL:
                    return Absent(f"{label}: not shown: the report already embeds {self.total >> 20} MiB of "
                                  f"images (at most {MAX_EMBED_TOTAL >> 20} MiB)")
                data = f.read(MAX_EMBED_BYTES + 1)
        except OSError as exc:
            return Absent(f"{label}: cannot be read ({exc.strerror or exc}), not shown")
        if len(data) > MAX_EMBED_BYTES or not data.startswith(_PNG_MAGIC):
            return Absent(f"{label}: not a PNG image, not shown")
        self.total += len(data)
        return figure(data, caption)


# ================================================================================================
# Cell text: plain values as the reports show them
# ================================================================================================


def cell_value(v: Any, unit: str | None = None) -> str:
    """The text of a table cell for a plain value: numbers formatted, None as an em dash."""
    if getattr(v, "shape", None) == () and hasattr(v, "item"):
        v = v.item()  # numpy scalars (from pandas rows) as Python numbers and bools
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if unit:
            return number(float(v), unit)
        return f"{v:,}" if isinstance(v, int) else f"{v:.4g}"
    text = str(v)
    return text if len(text) <= 160 else text[:157] + "..."


def generic_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Any list of row dicts as a table (columns in first-seen order)."""
    cols: dict[str, None] = {}
    for r in rows:
        for k in r:
            cols.setdefault(k)
    body = [[_table_cell(c, r.get(c)) for c in cols] for r in rows]
    num = (i for i, c in enumerate(cols) if all(isinstance(r.get(c), (int, float, type(None))) for r in rows))
    return table(list(cols), body, num=num)


# Column-name endings and the unit their numbers are shown in (FLOP/s before FLOP: longest first).
_COLUMN_UNITS = (("flops_per_s", "FLOP/s"), ("bytes_per_s", "B/s"), ("flops", "FLOP"), ("bytes", "B"),
                 ("joules", "J"), ("watts", "W"), ("_w", "W"))


def _table_cell(col: str, v: Any) -> str:
    """A generic table cell, with a unit guessed from the column name (flops, bytes, *_s, *_pct)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or (isinstance(v, float) and math.isnan(v)):
        return cell_value(v)
    c = col.lower()
    for suffix, unit in _COLUMN_UNITS:
        if c.endswith(suffix):
            return number(float(v), unit)
    if c.endswith("_s") or c == "seconds":
        return number(float(v) * 1e3, "ms")
    if c.endswith(("_pct", "fraction")):
        return f"{100 * v if c.endswith('fraction') else v:.3g} %"
    return cell_value(v)


def kv_table(pairs: Sequence[tuple[str, Any]]) -> Table:
    """Key / value rows."""
    return table(["key", "value"], [[str(k), cell_value(v)] for k, v in pairs], cls="kv")


# ================================================================================================
# Rendering
# ================================================================================================


@lru_cache(maxsize=1)
def environment() -> Any:
    """The Jinja2 environment of the report templates: autoescaping on for every template, undefined
    names an error (a template typo fails the tests instead of printing nothing)."""
    import jinja2  # lazy: only reports need it

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.globals["source_help"] = SOURCE_HELP
    return env


def page(template: str, **values: Any) -> str:
    """Render a whole report page (``run_report.html.j2`` or ``sweep_report.html.j2``)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return str(environment().get_template(template).render(stamp=stamp, **values))
