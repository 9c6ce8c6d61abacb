"""Write a run of someone else's loop: its folder saved, report.html, the summary on stderr (stdout is
the script's own)."""
from __future__ import annotations

from pathlib import Path

from lmprof.pipeline.protocol.folder import INCOMPLETE
from lmprof.pipeline.protocol.say import err
from lmprof.pipeline.protocol.spec import Spec
from lmprof.record.run import Run


def write(run: Run, folder: Path, spec: Spec) -> None:
    """Save ``run`` in ``folder``; report.html when ``spec.report``; the summary when ``spec.verbose``."""
    run.save(folder)
    (folder / INCOMPLETE).unlink(missing_ok=True)  # a watched run's folder is marked until its run.json is there
    if not spec.verbose:
        if spec.report:
            from lmprof.show.report import write_run_report

            write_run_report(run, folder)
        return
    from lmprof.show.summary import print_summary

    print_summary(run, folder, err(), report=spec.report)
