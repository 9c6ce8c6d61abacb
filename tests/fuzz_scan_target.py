"""The fuzz target of the C trace reader: any bytes, as one JSON list of events.

``one_input`` is what atheris calls (``scripts/fuzz.sh``, with the reader built under
AddressSanitizer) and what the suite calls on a fixed corpus (tests/test_trace_attack_fuzz.py):
the reader either refuses the bytes (None, and msgspec decides) or gives a chunk with as many rows
as the msgspec reader, and it never raises.
"""
from __future__ import annotations

from lmprof.errors import LmprofError
from lmprof.trace.kineto import decode, scan


def one_input(data: bytes) -> None:
    """Raise AssertionError when the C reader and msgspec disagree on ``data``; memory errors crash."""
    chunk = scan.scan_chunk(data)  # must never raise
    if chunk is None:
        return
    try:
        want = decode.decode_chunk(data, True)
    except (LmprofError, ValueError):
        raise AssertionError(f"the C reader accepted what msgspec refuses: {data[:200]!r}") from None
    assert chunk.n_raw == want.n_raw, (chunk.n_raw, want.n_raw, data[:200])


if __name__ == "__main__":  # python tests/fuzz_scan_target.py [libFuzzer flags]: fuzz with atheris
    import sys

    import atheris

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
