"""HTML building blocks for lmprof's self-contained reports: escaping, tables, sections, embedded PNGs, the page."""
from __future__ import annotations

import base64
import datetime as _dt
import html
import math
import os
import re
from pathlib import Path
from urllib.parse import quote
from typing import Any, Iterable, Mapping, Sequence

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


# ================================================================================================
# HTML pieces
# ================================================================================================


def esc(x: object) -> str:
    """HTML-escape anything (None -> '')."""
    return "" if x is None else html.escape(str(x), quote=True)


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


def _template(name: str) -> str:
    return (_TEMPLATES / name).read_text(encoding="utf-8")


def badge(source: str | None) -> str:
    """A coloured measured / estimated / derived label."""
    if not source:
        return ""
    return f'<span class="src src-{esc(source)}" title="{esc(_SOURCE_HELP.get(source, ""))}">{esc(source)}</span>'


_SOURCE_HELP = {
    "measured": "read from a clock or counter",
    "estimated": "from a model or formula",
    "derived": "arithmetic on measured figures",
}


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, num: Sequence[int] = (),
          cls: str = "", total_last: bool = False) -> str:
    """A table; cells are HTML already (escape before). ``num`` are right-aligned column indexes."""
    head = "".join(f'<th class="num">{esc(h)}</th>' if i in num else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body_rows = list(rows)
    out = []
    for r, row in enumerate(body_rows):
        tr = ' class="total"' if total_last and r == len(body_rows) - 1 else ""
        cells = "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(row))
        out.append(f"<tr{tr}>{cells}</tr>")
    return (f'<div class="scroll"><table class="{esc(cls)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(out)}</tbody></table></div>')


def section(sid: str, title: str, body: str, intro: str | None = None) -> str:
    """A report section with an anchor id (the navigation links to it)."""
    p = f'<p class="intro">{intro}</p>' if intro else ""
    return f'<section id="{esc(sid)}" data-section="{esc(sid)}"><h2>{esc(title)}</h2>{p}{body}</section>'


def absent(text: str = NOT_RECORDED) -> str:
    """The line a section shows when the run has nothing for it."""
    return f'<p class="absent">{esc(text)}</p>'


def png_data_uri(data: bytes) -> str:
    """``data:image/png;base64,...`` for embedding."""
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


class Embedder:
    """Embeds a report's PNG files: each distinct file (by real path) once, each at most
    :data:`MAX_EMBED_BYTES`, all together at most :data:`MAX_EMBED_TOTAL`; anything else is a note."""

    def __init__(self) -> None:
        self.seen: set[str] = set()  # real paths embedded (or refused) so far
        self.names: set[str] = set()  # names as the record lists them, for callers that claim files
        self.total = 0

    def png(self, path: Path, caption: str, name: str | None = None) -> str:
        """A <figure> for ``path``, "" when this file was embedded already, or a one-line note why not."""
        label = name or path.name
        try:
            real = os.path.realpath(path)
        except (OSError, ValueError):
            return absent(f"{label}: cannot be read, not shown")
        if real in self.seen:
            return ""  # the same file listed again (another spelling, a link): shown once
        self.seen.add(real)
        try:
            with open(real, "rb") as f:
                st = os.fstat(f.fileno())
                if not _is_regular(st.st_mode):
                    return absent(f"{label}: not a regular file, not shown")
                if st.st_size > MAX_EMBED_BYTES:
                    return absent(f"{label}: {st.st_size:,} bytes, more than the {MAX_EMBED_BYTES >> 20} MiB "
                                  "a report embeds; not shown (open the file itself)")
                if self.total + st.st_size > MAX_EMBED_TOTAL:
                    return absent(f"{label}: not shown: the report already embeds {self.total >> 20} MiB of "
                                  f"images (at most {MAX_EMBED_TOTAL >> 20} MiB)")
                data = f.read(MAX_EMBED_BYTES + 1)
        except OSError as exc:
            return absent(f"{label}: cannot be read ({exc.strerror or exc}), not shown")
        if len(data) > MAX_EMBED_BYTES or not data.startswith(_PNG_MAGIC):
            return absent(f"{label}: not a PNG image, not shown")
        self.total += len(data)
        return figure(data, caption)


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def figure(data: bytes, caption: str, alt: str | None = None) -> str:
    """An embedded PNG with a caption."""
    return (f'<figure><img src="{png_data_uri(data)}" alt="{esc(alt or caption)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def page(title: str, header: str, nav: Sequence[tuple[str, str]], body: str, script: bool = False) -> str:
    """The whole document: inline CSS (and the sorting script when asked), no external resources."""
    links = "".join(f'<a href="#{esc(sid)}">{esc(label)}</a>' for sid, label in nav)
    js = f"<script>{_template('sort.js')}</script>" if script else ""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_template('report.css')}</style></head>"
        f"<body><main><header>{header}<nav>{links}</nav></header>{body}"
        f"<footer>Written by lmprof on {stamp}. Self-contained: open it anywhere, offline.</footer>"
        f"</main>{js}</body></html>\n"
    )


def cell_value(v: Any, unit: str | None = None) -> str:
    """A table cell for a plain value: numbers formatted, None as an em dash."""
    if getattr(v, "shape", None) == () and hasattr(v, "item"):
        v = v.item()  # numpy scalars (from pandas rows) as Python numbers and bools
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if unit:
            return esc(number(float(v), unit))
        return esc(f"{v:,}" if isinstance(v, int) else f"{v:.4g}")
    text = str(v)
    return esc(text if len(text) <= 160 else text[:157] + "...")


# ================================================================================================
# Figures and metric tables
# ================================================================================================



def generic_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Any list of row dicts as a table (columns in first-seen order)."""
    cols: dict[str, None] = {}
    for r in rows:
        for k in r:
            cols.setdefault(k)
    body = []
    for r in rows:
        body.append([_table_cell(c, r.get(c)) for c in cols])
    num = tuple(i for i, c in enumerate(cols) if all(isinstance(r.get(c), (int, float, type(None))) for r in rows))
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
            return esc(number(float(v), unit))
    if c.endswith("_s") or c == "seconds":
        return esc(number(float(v) * 1e3, "ms"))
    if c.endswith(("_pct", "fraction")):
        return esc(f"{100 * v if c.endswith('fraction') else v:.3g} %")
    return cell_value(v)


def kv_html(pairs: Sequence[tuple[str, Any]]) -> str:
    return table(["key", "value"], [[esc(k), cell_value(v)] for k, v in pairs], cls="kv")



