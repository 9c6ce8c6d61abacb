"""What the sweep's fork server imports once (:mod:`lmprof.sweep.forked`), with Python's collector held
off meanwhile, then frozen: each worker forked from the server inherits those objects, and its
collector never walks them (nor copies their pages by touching them), as the ``gc.freeze`` documentation
advises for a server that forks. See :mod:`lmprof.gc_hold`."""
from lmprof import gc_hold

gc_hold.hold()

import torch  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401  (every torch optimizer imports it)

import lmprof.pipeline.infer  # noqa: E402,F401
import lmprof.pipeline.train  # noqa: E402,F401
import lmprof.sweep.worker  # noqa: E402,F401

gc_hold.release()
