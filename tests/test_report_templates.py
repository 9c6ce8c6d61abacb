"""The reports' Jinja2 templates: autoescaping on, nothing from a record becomes markup or template code,
the templates ship in the wheel, and the Embedder's bounds still hold."""
from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

import pytest

from lmprof.record.run import Metric
from lmprof.show import html as H
from lmprof.show.report import render_run_report, write_sweep_report
from sweep_fakes import _run, fake_sweep
from test_hostile import assert_inert

ROOT = Path(__file__).resolve().parents[1]
PAYLOADS = ['<script>alert(1)</script>', '"><img src=x onerror=alert(1)>', "{{ 7*7 }}", "{% raw %}", "</td></tr>",
            "&amp;lt;"]


def test_every_template_has_autoescaping_on():
    env = H.environment()
    for name in env.list_templates():
        if name.endswith(".j2"):
            env.get_template(name)  # compiles
    assert env.autoescape is True


def test_record_text_is_text_never_markup_nor_template(tmp_path):
    run = _run("r1", "train", "tiny", 2, 32)
    run.notes = list(PAYLOADS)
    run.config = {**run.config, "hf": PAYLOADS[1], "model_name": PAYLOADS[0]}
    run.metrics["step_time"] = Metric(value=3.0, unit="ms", source="measured", note=PAYLOADS[1])
    run.metrics[PAYLOADS[0]] = Metric(value=None, unit="ms", source="measured", note=PAYLOADS[2])
    run.blocks[0] = run.blocks[0].model_copy(update={"name": PAYLOADS[0]})
    run.tables = {**run.tables, "extra": [{PAYLOADS[1]: PAYLOADS[0], "n": 1}]}
    run.save(tmp_path / "run")
    text = render_run_report(run, tmp_path / "run")
    assert_inert(text)
    assert "<script>alert" not in text and "onerror=alert" not in text.replace("onerror=alert(1)&gt;", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "{{ 7*7 }}" in text and ">49<" not in text  # shown as written, never evaluated
    assert "&amp;amp;lt;" in text  # escaped once more, exactly as written
    # Every section is still there around the hostile text.
    assert len(re.findall(r'<section id="', text)) >= 13


def test_sweep_text_is_text(tmp_path):
    import sqlite3

    from lmprof.record.store import DB_NAME

    sweep = fake_sweep(tmp_path / "sw")
    conn = sqlite3.connect(sweep / DB_NAME)
    with conn:
        conn.execute("UPDATE points SET status = 'error', message = ? WHERE rowid = 1", (PAYLOADS[0],))
        conn.execute("UPDATE points SET label = ? WHERE rowid = 2", (PAYLOADS[1],))
    conn.close()
    text = write_sweep_report(sweep).read_text()
    assert_inert(text, scripts=1)  # the sorting script only
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_the_embedder_still_bounds_and_embeds_each_file_once(tmp_path, monkeypatch):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 100
    (tmp_path / "a.png").write_bytes(png)
    (tmp_path / "big.png").write_bytes(png + b"\0" * 200)
    (tmp_path / "fake.png").write_bytes(b"GIF89a")
    monkeypatch.setattr(H, "MAX_EMBED_BYTES", 250)
    monkeypatch.setattr(H, "MAX_EMBED_TOTAL", 150)
    e = H.Embedder()
    first = e.png(tmp_path / "a.png", "a")
    assert isinstance(first, H.Figure) and first.src.startswith("data:image/png;base64,")
    assert e.png(tmp_path / "." / "a.png", "again") is None  # one embed per file
    big = e.png(tmp_path / "big.png", "big")
    assert isinstance(big, H.Absent) and "more than" in big.text
    (tmp_path / "b.png").write_bytes(png)
    over = e.png(tmp_path / "b.png", "b")
    assert isinstance(over, H.Absent) and "already embeds" in over.text
    fake = e.png(tmp_path / "fake.png", "fake")
    assert isinstance(fake, H.Absent) and "not a PNG" in fake.text


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_the_templates_are_package_data():
    """A wheel carries what pyproject's package-data names: every template must match it."""
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lmprof"]
    templates = ROOT / "src" / "lmprof" / "show" / "templates"
    names = [p.relative_to(ROOT / "src" / "lmprof").as_posix() for p in templates.iterdir()]
    assert any(n.endswith(".j2") for n in names)
    for n in names:
        assert any(fnmatch.fnmatch(n, g) for g in globs), n
    # Every template a report renders exists.
    for name in ("run_report.html.j2", "sweep_report.html.j2", "page.html.j2", "parts.html.j2"):
        assert (templates / name).is_file()
