"""TensorBoard: event files written with torch's SummaryWriter, readable by tensorboard's EventAccumulator.

Layout: ``DEST/[GROUP/]RUN_ID/`` holds the events; figures are scalars at step 0 named by
:func:`~lmprof.trackers.content.metric_name` (unit in the name), each block's time a scalar
``blocks/<block>/<phase>_ms``, the figure and block tables and the
config are text (Markdown tables), the config also as HParams, plots as images (the PNG bytes as
they are), and the report, trace and CSVs are copied into ``artifacts/`` beside the events
(TensorBoard has no artifact store). A second export of the same run to the same folder replaces the
event file the first one wrote (kept in the run folder: :mod:`~lmprof.trackers.ledger`), so each
scalar stays one point.
"""
from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

from lmprof.atomic import atomic_path
from lmprof.record.run import Run
from lmprof.trackers import ledger
from lmprof.trackers.content import BLOCK_COLUMNS, artifacts, block_rows, block_scalars, figures, params, plots

DEFAULT_DEST = "tensorboard"


def _md_table(header: list[str], rows: list[list[object]]) -> str:
    def cell(x: object) -> str:
        return "" if x is None else str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows])


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def export_run(run: Run, dest: str | None, *, project: str, group: str | None) -> str:
    """Write ``run`` as TensorBoard events under ``dest/[group/]run.id``; returns the log folder."""
    root = Path(dest if dest is not None else DEFAULT_DEST)
    logdir = root / group / run.id if group else root / run.id
    folder = Path(run.folder) if run.folder is not None else None
    where = str(logdir.resolve())
    earlier = ledger.recall(folder, "tensorboard", where) if folder is not None else None
    before = set(logdir.glob("events.out.tfevents.*"))
    _write(run, logdir, prefix="", hparams=True)
    new = sorted(set(logdir.glob("events.out.tfevents.*")) - before)
    if earlier is not None and new and Path(earlier).name == earlier and earlier not in {p.name for p in new}:
        (logdir / earlier).unlink(missing_ok=True)
    if folder is not None and new:
        ledger.remember(folder, "tensorboard", where, new[-1].name)
    return str(logdir) + (" (updated)" if earlier is not None else "")


def export_into(run: Run, logdir: Path) -> str:
    """Write ``run`` into a TensorBoard run the caller already logs to (its log folder), every tag under
    ``lmprof/`` and no HParams (they would stand for the caller's run); returns the log folder."""
    _write(run, logdir, prefix="lmprof/", hparams=False)
    return str(logdir)


def _write(run: Run, logdir: Path, *, prefix: str, hparams: bool) -> None:
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard import summary

    figs = figures(run)
    writer = SummaryWriter(log_dir=str(logdir))
    # SummaryWriter declares file_writer Optional; it is set by the constructor (torch's stubs are loose).
    fw: Any = writer.file_writer
    make_hparams: Any = summary.hparams
    try:
        for f in figs:
            writer.add_scalar(f"{prefix}{f.name}", f.value, global_step=0)
        for name, value in block_scalars(run):
            writer.add_scalar(f"{prefix}{name}", value, global_step=0)
        writer.add_text(f"{prefix}figures", _md_table(
            ["figure", "logged as", "value", "unit", "source", "p10", "p90", "n"],
            [[f.key, f"{prefix}{f.name}", f.value, f.unit, f.source, f.p10, f.p90, f.n] for f in figs]), global_step=0)
        if run.blocks:
            writer.add_text(f"{prefix}blocks", _md_table(list(BLOCK_COLUMNS), block_rows(run)), global_step=0)
        config = params(run)
        writer.add_text(f"{prefix}config", _md_table(["option", "value"], [[k, v] for k, v in config.items()]),
                        global_step=0)
        if hparams:
            exp, ssi, sei = make_hparams(config, {f.name: f.value for f in figs})
            for s in (exp, ssi, sei):
                fw.add_summary(s)
        for png in plots(run):
            data = png.read_bytes()
            width, height = _png_size(data)
            image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=data)
            fw.add_summary(
                Summary(value=[Summary.Value(tag=f"{prefix}plots/{png.stem}", image=image)]), global_step=0)
    finally:
        writer.close()
    for path in artifacts(run):
        with atomic_path(logdir / "artifacts" / path.name) as tmp:
            shutil.copy2(path, tmp)
