"""Builds the optional C reader of trace events (lmprof.trace._scan) and the compiled nesting walk
(lmprof.trace._nest); everything else is in pyproject.toml.

optional=True: where no compiler is available the install still succeeds and lmprof decodes traces
with msgspec alone (lmprof.trace.scan.NATIVE is then False).
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "lmprof.trace._scan",
            sources=["src/lmprof/trace/_scan.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "lmprof.trace._nest",
            sources=["src/lmprof/trace/_nest.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
    ]
)
