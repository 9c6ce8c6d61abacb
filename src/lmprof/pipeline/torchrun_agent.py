"""``python -m lmprof.pipeline.torchrun_agent ARGS``: torchrun (``python -m torch.distributed.run ARGS``)
with Python's garbage collector held off while torch is imported.

torchrun's agent only starts, watches and stops the ranks, but importing torch and its elastic agent
took it 1.4-1.5 s of CPU, 1.0 s with the collector held (:mod:`lmprof.gc_hold`), on the same cores the
ranks start on. What the import built is frozen and collection is on again before torchrun runs,
so the agent itself runs as it always does. Each rank is an ``lmprof`` command and holds its own.
"""
from lmprof import gc_hold

gc_hold.hold()
from torch.distributed.run import main  # noqa: E402

gc_hold.release()

if __name__ == "__main__":
    main()
