"""Exit 2 with one line when lmprof cannot be installed into the venv at argv[1].

setuptools expands ``$name`` in the install prefix as a variable, so building lmprof's C reader into
a venv whose absolute path holds a ``$`` (a checkout under ``/tmp/a $x/``) failed with a traceback
deep in distutils, after the whole set-up had run. Only the venv's path matters: the checkout may
hold a ``$`` when the venv is elsewhere (``make VENV=...``).
"""
from __future__ import annotations

import os
import sys

venv = os.path.abspath(sys.argv[1])
if "$" in venv:
    print(f"make: lmprof cannot be installed into {venv}: setuptools reads the '$' in that path as a "
          "variable; put the venv elsewhere, e.g. make VENV=/tmp/lmprof-venv test", file=sys.stderr)
    sys.exit(2)
