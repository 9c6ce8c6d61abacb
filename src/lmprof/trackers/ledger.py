"""Which tracker run a run folder went to: kept in the folder, so a second export updates that tracker
run instead of making another.

``<run folder>/trackers.json`` maps a tracker and a destination (an MLflow tracking URI and
experiment, a W&B folder and project, a TensorBoard log folder) to what lmprof made there (the MLflow
run id, the W&B run id, the TensorBoard event file). It is written atomically; one that cannot be read
(damaged, too large, not JSON) counts as empty, and one that cannot be written (a read-only run
folder) is a note on stderr: the export itself has happened, a next one makes another tracker run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from lmprof.atomic import write_text

LEDGER = "trackers.json"
_MAX_BYTES = 1 << 20  # a ledger holds a few ids: anything larger was not written by lmprof


def _read(folder: Path) -> dict[str, dict[str, str]]:
    path = folder / LEDGER
    try:
        if path.stat().st_size > _MAX_BYTES:
            return {}
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {t: {k: v for k, v in d.items() if isinstance(k, str) and isinstance(v, str)}
            for t, d in data.items() if isinstance(t, str) and isinstance(d, dict)}


def recall(folder: Path, tracker: str, where: str) -> str | None:
    """What lmprof made at ``where`` in ``tracker`` for this run folder, or None."""
    return _read(folder).get(tracker, {}).get(where)


def remember(folder: Path, tracker: str, where: str, what: str) -> None:
    """Keep ``what`` (a tracker's run id, a file name) for ``where``; a failure to write is a note only."""
    data = _read(folder)
    data.setdefault(tracker, {})[where] = what
    try:
        write_text(folder / LEDGER, json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        print(f"lmprof: note: cannot keep the {tracker} run id in {folder} ({exc.strerror or exc}): a next export "
              "makes another tracker run", file=sys.stderr)
