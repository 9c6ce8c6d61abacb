"""Builds the optional C reader of trace events (lmprof.trace.kineto._scan) and the compiled nesting walk
(lmprof.trace._nest); everything else is in pyproject.toml.

optional=True: where no compiler is available the install still succeeds and lmprof decodes traces
with msgspec alone (lmprof.trace.kineto.scan.NATIVE is then False).

-O3 (Python's own CFLAGS have it; -O2 here used to override it): the reader scans 5% faster, which is
a twentieth of loading a large trace. -fno-fast-math: numbers are parsed and rounded exactly as
msgspec does (tests/test_trace_scan.py checks 20,000 spellings).
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lmprof.trace.kineto._scan",
            sources=["src/lmprof/trace/kineto/_scan.c"],
            # its key table, generated from the event schema (scripts/gen_scan_keys.py)
            depends=["src/lmprof/trace/kineto/_keys.h"],
            extra_compile_args=["-O3", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "lmprof.trace._nest",
            sources=["src/lmprof/trace/_nest.c"],
            extra_compile_args=["-O3", "-fno-fast-math"],
            optional=True,
        ),
    ]
)
