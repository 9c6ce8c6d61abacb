"""Helpers shared by verb modules: merging YAML with flags, the console."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

# Piped output (CI logs, files) gets a fixed width instead of rich's 80-column fallback; plain lines
# are never hard-wrapped (a path or a message split mid-phrase breaks grep), tables still fit.
_probe = Console()
console = Console(highlight=False, width=None if _probe.is_terminal else 120, soft_wrap=True)


def merged(yaml_values: dict[str, Any], **flags: Any) -> dict[str, Any]:
    """YAML values overridden by the flags the user actually gave (None means not given)."""
    out = dict(yaml_values)
    out.update({k: v for k, v in flags.items() if v is not None})
    return out


def write_report(run: Any, folder: Path, enabled: bool = True) -> None:
    """Write report.html into the run folder and print where it is."""
    if not enabled:
        return
    from lmprof.show.report import write_run_report

    path = write_run_report(run, folder)
    console.print(f"report: {path}  (open it in a browser; the trace opens in https://ui.perfetto.dev)")
