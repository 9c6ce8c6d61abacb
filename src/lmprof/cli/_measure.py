"""How ``lmprof train`` and ``lmprof infer`` run their measurement and show what it wrote."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from lmprof.cli._oom import gpt_fit, oom_guard
from lmprof.cli.common import interruptible, progress_status, show_run
from lmprof.config import InferConfig, TrainConfig


def measure_and_show(cfg: TrainConfig | InferConfig, what: str, status: str, measure: Callable[[], tuple[Any, Path]],
                     report: bool, trackers: list[str]) -> None:
    """Run ``measure`` (one run of ``cfg``'s model) and show the run it wrote (:func:`show_run`).

    While it runs, Ctrl-C and SIGTERM keep what was measured (:func:`interruptible`), ``status`` shows
    how far it has come, and an out-of-memory is one line naming ``what`` ran out and the largest
    batch the memory estimate fits on the device (built-in GPT only).
    """
    # Imported here, after the verb has checked its flags: lmprof.hardware.devices imports torch.
    from lmprof.hardware.devices import resolve_device

    kind = resolve_device(cfg.device).kind
    with interruptible(), progress_status(status), oom_guard(what, gpt_fit(cfg, kind), kind):
        run, folder = measure()
    show_run(run, folder, report, trackers)
