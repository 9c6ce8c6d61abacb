"""``lmprof run``: a door that runs a script (or ``-m`` module) unchanged, in this process, under a session.

The script runs with ``runpy`` as ``__main__`` with ``sys.argv`` set to its own arguments and its
folder first on ``sys.path``, as ``python script.py`` would. Its exit code is kept: ``sys.exit(n)``
gives n, an uncaught exception prints its traceback and gives 1, and ``--stop-after`` gives 0 once the
run is written. Whatever ends it, the session writes what was measured and says what happened.
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from lmprof.pipeline.protocol import active
from lmprof.pipeline.protocol.driver import Observer
from lmprof.pipeline.protocol.ending import StopScript, TermHandler, exit_now
from lmprof.pipeline.protocol.say import say
from lmprof.pipeline.protocol.session import Session
from lmprof.pipeline.protocol.spec import Spec
from lmprof.pipeline.protocol.triggers import GenerateTrigger, OptimizerTrigger
from lmprof.pipeline.usercode.guard import check_target


@dataclass
class ScriptResult:
    exit_code: int
    session: Session
    signal: int | None = None  # the script was ended by this signal: the caller dies of it once it has spoken


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1, as python does
    return 1


def print_as_python_would(exc: BaseException) -> None:
    """The script's uncaught exception on stderr as ``python script.py`` prints it: from the
    script's own first frame, without the frames of lmprof and runpy that ran it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _RUNNER_FILES:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)


_RUNNER_FILES = {__file__, runpy.__file__, "<frozen runpy>"}


def _session(spec: Spec) -> Session:
    # training: nothing tells when the first step began, so the first optimizer step only marks a start
    return Session(spec, Observer(first_step_marks_start=spec.traits.trains))


def run_script(target: str, args: list[str], spec: Spec, module: bool = False) -> ScriptResult:
    """Run ``target`` (a path, or a module name with ``module``) under a session; never raises for
    what the script does."""
    check_target(target, module)
    session = _session(spec)
    if spec.traits.generates:
        GenerateTrigger(session).install()
    else:
        OptimizerTrigger(session).install()
    old_argv, old_path = sys.argv[:], sys.path[:]
    sys.argv = [target, *args]
    if module:
        sys.path.insert(0, os.getcwd())
    elif not Path(target).is_dir():  # run_path puts a folder (or zip) itself first on sys.path, as python does
        sys.path.insert(0, str(Path(target).resolve().parent))
    active.register(session)
    code, reason, signum = 0, None, None

    def on_term(name: str) -> None:
        if not session.done:
            session.finish(f"the script received {name}")
        if session.message:
            say(f"lmprof: {session.message}")

    term = TermHandler(on_term)
    term.install()
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
        reason = "the script ended"
    except StopScript:
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
        reason = f"the script exited (code {code})"
    except KeyboardInterrupt as exc:  # as python: the traceback, then death by SIGINT (the caller, once lmprof has spoken)
        print_as_python_would(exc)
        code, reason, signum = 130, "the script was interrupted (SIGINT)", signal.SIGINT
    except BaseException as exc:  # the script's own error: show it as python would, keep going
        print_as_python_would(exc)
        code, reason = 1, f"the script raised {type(exc).__name__}"
    finally:
        term.remove()
        if session.stop_again is not None:  # the script ended (StopScript or not): nothing left to stop
            session.stop_again.remove()
        sys.argv, sys.path[:] = old_argv, old_path
        active.release(session)
    if os.getpid() != session.pid:  # a forked child of the script got here: not its session
        if session.forked_in_window:
            exit_now(code)  # Python's finalization would wait forever in the parent's profiler teardown
        return ScriptResult(code, _session(spec), signum)
    if not session.done:
        session.finish(reason)
    elif session.spec.stop_after and reason is None:
        session.message = f"--stop-after: stopped the script once the run was written to {session.folder}"
    return ScriptResult(code, session, signum)
