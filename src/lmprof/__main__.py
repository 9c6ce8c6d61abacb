"""``python -m lmprof`` (also what torchrun launches with ``-m lmprof``)."""
from lmprof.cli.main import main

main()
