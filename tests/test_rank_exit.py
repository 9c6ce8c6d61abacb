"""How a rank of ``lmprof run --nproc N`` leaves (pipeline.distributed.end_rank_process): as Python's own
exit would, minus finalization (gloo's worker threads are never joined; see docs/distributed.md)."""
import subprocess
import sys
import textwrap


def test_end_rank_process_waits_for_threads_runs_atexit_and_keeps_the_code() -> None:
    code = textwrap.dedent("""
        import atexit, sys, threading, time
        from lmprof.pipeline.distributed import end_rank_process

        class Finalized:
            def __del__(self):
                print("finalized")  # module teardown at finalization: skipped

        keep = Finalized()
        atexit.register(print, "atexit")
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread"))).start()
        sys.stdout.write("unflushed ")  # no newline: stays in the buffer until the flush
        end_rank_process(7)
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7, proc.stderr
    # Python's order: non-daemon threads are waited for, then the atexit handlers, then stdio flushed.
    assert proc.stdout == "unflushed thread\natexit\n"
