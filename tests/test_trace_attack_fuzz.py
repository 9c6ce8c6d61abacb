"""The C reader's fuzz target on a fixed corpus, without AddressSanitizer (scripts/fuzz.sh runs it
coverage-guided under ASan): stored traces' event lists and the seeded mutants must agree."""
from __future__ import annotations

import json

import pytest

from fuzz_scan_target import one_input
from lmprof.trace.kineto import scan as scan_mod
from test_trace_attack_differential import BASE, _mutants

pytestmark = pytest.mark.skipif(not scan_mod.NATIVE, reason="the C reader is not built")


def _corpus() -> list[bytes]:
    whole = json.dumps(BASE["traceEvents"]).encode()
    return [whole, b"[]", b"[", b"", b"[{}]", b"[1,2]", b'[{"ph":"X"}]', *(_m.replace(b'{"traceEvents": ', b"", 1)
                                                                         for _m in _mutants())]


def test_the_fuzz_target_holds_on_the_fixed_corpus():
    for data in _corpus():
        one_input(data)
