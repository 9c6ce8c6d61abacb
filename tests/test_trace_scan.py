"""The compiled event reader (lmprof.trace.kineto._scan) against the msgspec decoder it stands in for.

The C reader is a fast path: for every list it accepts, its Chunk must equal the msgspec path's
(decode.decode_chunk) exactly; everything else it must refuse. Checked chunk by chunk on every real
trace in tests/data, on thousands of mutated event lists, on random number spellings, and on
hand-written edge cases.
"""
from __future__ import annotations

import gzip
import json
import random
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmprof.trace.kineto import decode as dec
from lmprof.trace.kineto import scan
from lmprof.trace.kineto.columns import hw_frame
from lmprof.trace.kineto.load import _split

DATA = Path(__file__).parent / "data" / "traces"
native = pytest.mark.skipif(scan._scan is None, reason="the C reader is not built (no compiler at install)")


def _view(ch: dec.Chunk) -> dict[str, Any]:
    """A Chunk with local codes resolved to values (two readers may number names differently)."""
    out: dict[str, Any] = {
        "n_raw": ch.n_raw, "skipped": ch.skipped, "repaired": ch.repaired_utf8, "problem": ch.first_problem,
        "out_of_range": dict(sorted(ch.out_of_range.items())), "comms": (ch.comm_rows, ch.comm_values),
        "memory": ch.memory,
        "shapes": (ch.shape_rows.tolist(), [ch.shape_values[c] for c in ch.shape_codes.tolist()]),
    }  # fmt: skip
    for key, table, coded in (("x", ch.x, ch.x_coded), ("fl", ch.fl, ch.fl_coded)):
        cols: dict[str, Any] = {}
        for k, v in table.items():
            lookup = {"name": ch.names, "cat": ch.cats, "ph": ch.phs}.get(k)
            cols[k] = [lookup[i] for i in v.tolist()] if lookup is not None else (str(v.dtype), v.tobytes())
        out[key] = cols
        out[key + "_coded"] = {f: (c.rows, c.text) for f, c in coded.items()}
    if ch.x:  # kernel resources as the hardware table reads them (None and NaN both mean absent)
        hw = hw_frame(ch.hw_rows, {f: [v] for f, v in ch.hw_cols.items()}, np.ones(ch.hw_rows.size, dtype=bool))
        out["hw"] = {c: hw[c].tobytes() for c in hw.columns}
    return out


def _same_or_refused(payload: bytes) -> bool:
    """True when the C reader accepted ``payload`` (and then agrees with msgspec), False if refused."""
    got = scan.scan_chunk(payload)
    if got is None:
        return False
    want = dec.decode_chunk(payload, exact=False)  # must not raise: the C reader accepted valid input
    a, b = _view(got), _view(want)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k], (k, payload[:500])
    return True


def test_the_reader_is_built_where_a_compiler_is():
    """CI has gcc: a failed or stale build must not silently leave only the slow path."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip(f"no C compiler ({cc}) or Python headers here: traces are read by msgspec alone")
    assert scan._scan is not None, "lmprof.trace.kineto._scan is missing or stale: rerun `make setup`"
    assert scan.NATIVE or scan.os.environ.get("LMPROF_TRACE_NATIVE") == "0"


@native
@pytest.mark.parametrize("path", sorted(DATA.glob("*.json.gz")), ids=lambda p: p.name.split(".")[0])
def test_real_traces_chunk_by_chunk(path, monkeypatch):
    """Every chunk of every real trace: accepted and equal (small reads, so many cut points)."""
    import lmprof.trace.read as read_mod

    monkeypatch.setattr(read_mod, "READ_BYTES", 256 << 10)
    seen = []
    _split(path, lambda view, exact: seen.append(_same_or_refused(bytes(view))))
    assert seen and all(seen)  # real traces are plain: none refused


def test_kept_views_stay_as_handed_out(monkeypatch):
    """A worker thread decodes the splitter's view after the splitter has gone on: every view kept
    to the end still holds the bytes it held when handed out, and together they are the trace's events."""
    import lmprof.trace.read as read_mod

    monkeypatch.setattr(read_mod, "READ_BYTES", 64 << 10)
    path = DATA / "gpu_2rank_rank0.json.gz"
    kept: list[tuple[memoryview, bytes]] = []
    _split(path, lambda view, exact: kept.append((view, bytes(view))))
    assert len(kept) > 10
    assert all(bytes(view) == at_hand for view, at_hand in kept)
    events = [e for _, raw in kept for e in json.loads(raw)]
    assert events == json.loads(gzip.open(path).read())["traceEvents"]


@native
def test_columns_outlive_the_scan_that_made_them():
    """The C reader hands each column over as the buffer it scanned into (no copy): arrays kept after
    the scan's result is dropped, and after the heap has been reused, still hold the events' values
    (the truth: the same events parsed by json)."""
    import gc

    events = [{"ph": "X", "name": f"op{i % 7}", "cat": "cpu_op", "pid": 1, "tid": 2 + i % 3,
               "ts": 1000.5 + 3 * i, "dur": 1.25 + i} for i in range(5000)]
    raw = json.dumps(events).encode()
    got = scan.scan_chunk(raw)
    assert got is not None  # plain events: the C reader takes them
    ts, dur, tid = got.x["ts"], got.x["dur"], got.x["tid"]
    del got
    gc.collect()
    junk = [bytearray(len(raw)) for _ in range(20)]  # reuse whatever was freed
    assert ts.tolist() == [e["ts"] for e in events]
    assert dur.tolist() == [e["dur"] for e in events]
    assert tid.tolist() == [e["tid"] for e in events]
    del junk


def _events() -> list[dict[str, Any]]:
    evs = json.loads(gzip.open(DATA / "gpu_2rank_rank0.json.gz").read())["traceEvents"]
    evs += json.loads(gzip.open(DATA / "cpu_ops_only.json.gz").read())["traceEvents"][:3000]  # record_shapes
    return evs + json.loads(gzip.open(DATA / "amd_mi250_train.json.gz").read())["traceEvents"]


_ODD_VALUES: list[Any] = [
    "", "Spans", "0x1f", "42", "3.0", "\u00e9t\u00e9", 'q"uo\\te', "x" * 300, "[memory]", "nccl:all_reduce",
    2**63, -(2**63), 2**63 - 1, -(2**63) - 1, 2**64, 10**25, 1.5, -0.0, 1e-320, 1.7976931348623157e308,
    True, False, None, [1, "s"], {"k": 2}, 9007199254740993, 1712195495519695.8,
    [[2, 3], []], [[[1, 2], [3]], [4]], [[2**50]], [[-1]], [["x"]], ["float", 3], [[True]],
]  # fmt: skip
_KEYS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args", "bp", "s"]
_ARG_KEYS = [
    "correlation", "External id", "Sequence number", "stream", "device", "Collective name", "In msg nelems",
    "registers per thread", "shared memory", "blocks per SM", "warps per SM", "est. achieved occupancy %",
    "bytes", "Bytes", "Addr", "Total Allocated", "Seq", "Group size", "dtype", "Process Group Name",
    "Input Dims", "Input type",
]  # fmt: skip
_INSERTS = [b'"', b"\\", b"{", b"}", b",", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"1e999", b"-", b"\\u0041",
            b'"x":1,', b'"pid":7,', b'"pid":7,"pid":8,']  # fmt: skip


def _mutated(rng: random.Random, events: list[dict[str, Any]]) -> bytes:
    chosen = []
    start = rng.randrange(len(events) - 30)
    for e in events[start : start + rng.randrange(1, 30)]:
        if rng.random() < 0.3:
            e = json.loads(json.dumps(e))
            for _ in range(rng.randrange(1, 4)):
                k = rng.randrange(5)
                if k == 0:
                    e[rng.choice(_KEYS)] = rng.choice(_ODD_VALUES)
                elif k == 1 and isinstance(e.get("args"), dict):
                    e["args"][rng.choice(_ARG_KEYS)] = rng.choice(_ODD_VALUES)
                elif k == 2:
                    e["ph"] = rng.choice(["X", "s", "t", "f", "i", "I", "M", "", "XX"])
                elif k == 3:
                    e["name"] = rng.choice(["[memory]", "nccl:x", "record_param_comms", "a\nb", "\u2603"])
                else:
                    e.pop(rng.choice(_KEYS), None)
        chosen.append(e)
    sep = rng.choice([(", ", ": "), (",", ":")])
    text = "[" + ",\n  ".join(json.dumps(e, separators=sep, ensure_ascii=rng.random() < 0.2) for e in chosen) + "]"
    payload = bytearray(text.encode())
    if rng.random() < 0.3:  # and byte-level damage
        for _ in range(rng.randrange(1, 4)):
            if not payload:
                break
            i = rng.randrange(len(payload))
            k = rng.randrange(4)
            if k == 0:
                payload[i] = rng.randrange(256)
            elif k == 1:
                del payload[i : i + rng.randrange(1, 20)]
            elif k == 2:
                payload[i:i] = rng.choice(_INSERTS)
            else:
                del payload[i:]
    return bytes(payload)


@native
@pytest.mark.parametrize("seed", range(4))
def test_mutated_lists_are_equal_or_refused(seed):
    """Odd types, odd values, duplicate keys, escapes, invalid UTF-8, truncation: where the C
    reader accepts, it agrees with msgspec, and it accepts nothing msgspec rejects."""
    rng = random.Random(seed)
    events = _events()
    accepted = sum(_same_or_refused(_mutated(rng, events)) for _ in range(600))
    assert accepted > 60  # the mix must exercise the accepting path too


def _decimal(rng: random.Random) -> str:
    k = rng.randrange(4)
    if k == 0:
        digits = str(rng.randrange(1, 10 ** rng.randrange(1, 25)))
        i = rng.randrange(1, len(digits) + 1)
        return digits[:i] + ("." + digits[i:] if i < len(digits) else "")
    if k == 1:
        return repr(rng.uniform(0, 1e16))
    if k == 2:
        return f"{rng.randrange(1, 10**19)}e{rng.randrange(-40, 40)}"
    return repr(rng.randrange(2**52, 2**64) / 10 ** rng.randrange(0, 6))


@native
def test_times_are_correctly_rounded():
    """ts/dur: the same double as msgspec (and Python's float) for 20,000 random spellings, many of
    them 17-19 significant digits where the fast paths must round exactly."""
    rng = random.Random(7)
    tokens = [_decimal(rng) for _ in range(20_000)]
    payload = ("[" + ",".join('{"ph":"X","ts":%s,"dur":%s}' % (a, b) for a, b in zip(tokens[::2], tokens[1::2])) + "]")
    got = scan.scan_chunk(payload.encode())
    assert got is not None
    assert got.x["ts"].tolist() == [float(t) for t in tokens[::2]]
    assert got.x["dur"].tolist() == [float(t) for t in tokens[1::2]]


@native
@pytest.mark.parametrize(
    "event",
    [
        {"ph": "X", "name": "p\\u0069d"},  # \u escapes are left to msgspec
        {"ph": "X", "pid": True},
        {"ph": "X", "pid": 1.5},
        {"ph": "X", "pid": 2**63},
        {"ph": "X", "ts": "12"},
        {"ph": "X", "ts": 1e999},
        {"ph": "X", "name": None},
        {"ph": "X", "cat": None},
        {"ph": "X", "args": [1]},
        {"ph": "X", "args": {"correlation": {"a": 1}}},
    ],
)
def test_refuses_what_it_does_not_handle(event):
    raw = json.dumps([event]).replace("\\\\u", "\\u").encode()
    assert scan.scan_chunk(raw) is None
    assert isinstance(scan.read_chunk(raw, exact=True), dec.Chunk)  # msgspec still reads it


@native
@pytest.mark.parametrize("value", ['"9216"', '"32"', '"0x10"', '"a\\"b"', '""'])
def test_text_where_a_copy_size_or_kernel_resource_goes_is_absent_as_msgspec_reads_it(value):
    """ROCm writes a runtime copy call's size as text ("bytes": "9216" on hipMemcpyAsync); the C reader refused
    the chunk, and so sent every chunk of a ROCm 7 trace to msgspec. Both now read it as absent (NaN)."""
    raw = ('[{"ph":"X","cat":"cuda_runtime","name":"hipMemcpyAsync","ts":1,"dur":2,"args":{"correlation":5,'
           f'"bytes":{value}}}}},{{"ph":"X","cat":"kernel","name":"k","ts":3,"dur":1,"args":{{"correlation":5,'
           f'"registers per thread":{value},"bytes":64}}}}]').encode()
    assert _same_or_refused(raw)  # accepted, and equal to msgspec's reading
    assert np.isnan(scan.scan_chunk(raw).hw_cols["registers"]).all()


@native
@pytest.mark.parametrize(
    "raw",
    [
        b'[{"ph":"X","pid":1,"pid":2}]',  # duplicate field
        b'[{"ph":"X","name":"\xff"}]',  # invalid UTF-8
        b'[{"ph":"X","name":"a\x01b"}]',  # raw control character
        b'[{"ph":"X","x":' + b"[" * 100 + b"]" * 100 + b"}]",  # deeper than the reader goes
        b'[{"ph":"X"}] junk',
        b'[{"ph":"X"},]',
        b'[{"ph":"X","ts":01}]',
        b'[{"ph":"X","ts":1.}]',
        b'[{"ph":"X","ts":-}]',
        b"[1]",
        b'[{"ph":"X"',
        b"",
    ],
)
def test_refuses_invalid_or_unusual_json(raw):
    assert scan.scan_chunk(raw) is None


@native
def test_text_ids_and_defaults_follow_the_decoder():
    """Ids written as text (names as thread ids, hex streams), nulls and absent fields: hand-checked
    values, and equal to the msgspec path."""
    events = [
        {"ph": "X", "name": "a", "pid": "Spans", "tid": "0x1f", "ts": 1, "dur": 2,
         "args": {"stream": "0x7", "device": "gpu0", "correlation": None, "External id": 5}},
        {"ph": "X", "name": "b", "pid": None, "tid": "", "ts": None, "args": None},
        {"ph": "s", "id": "flow7", "pid": 3, "tid": "main", "ts": 4, "cat": "ac2g", "name": "x"},
        {"ph": "f", "id": 9, "pid": 3, "tid": 4, "ts": 5, "cat": "ac2g", "bp": "e", "name": "x"},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 6, "args": {"Bytes": 64, "Addr": "0x10"}},
        {"ph": "M", "name": "process_name", "pid": "Traces", "args": {"name": "x"}},
    ]  # fmt: skip
    raw = json.dumps(events).encode()
    assert _same_or_refused(raw)
    ch = scan.scan_chunk(raw)
    assert ch is not None and ch.n_raw == 6
    assert ch.x["tid"].tolist() == [31, 0] and ch.x["pid"].tolist() == [0, 0]
    assert ch.x_coded["pid"].rows == [0] and ch.x_coded["pid"].text == ["Spans"]
    assert ch.x["stream"].tolist() == [7, -1] and ch.x["device"].tolist() == [-1, -1]
    assert ch.out_of_range == {"args.device": 1}
    assert ch.x["external_id"].tolist() == [5, -1] and ch.x["correlation"].tolist() == [-1, -1]
    assert ch.x["ts"].tolist() == [1.0, 0.0] and ch.x["dur"].tolist() == [2.0, 0.0]
    assert ch.fl["id"].tolist() == [0, 9] and ch.fl_coded["id"].text == ["flow7"]
    assert ch.fl_coded["tid"].rows == [0] and [ch.phs[i] for i in ch.fl["ph"]] == ["s", "f"]
    assert len(ch.memory) == 1 and ch.memory[0][0] == 6 and ch.memory[0][3:] == (None, None, 64, "0x10", None, None, None)


@native
def test_escaped_names_decode_like_msgspec():
    events = [{"ph": "X", "name": 'say "hi"\n\ttab/\\slash', "cat": "cpu_op", "ts": 1, "dur": 1}]
    raw = json.dumps(events).replace("/", "\\/").encode()
    assert _same_or_refused(raw)
    ch = scan.scan_chunk(raw)
    assert ch is not None and ch.names == ['say "hi"\n\ttab/\\slash']


@native
def test_input_shapes_are_read_where_an_args_key_says_so():
    """The C reader takes "Input Dims" and "Input type" as args keys and hands over each distinct raw
    value once: shapes equal msgspec's whether the key is in an operator's args, only in a name or a
    string value, or in the args of an event that is no operator; a null or absent "Input type" is
    no dtypes, a null "Input Dims" no shapes; equal shapes written with other spacing share a code."""
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2,
          "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}}
    as_name = {"ph": "X", "cat": "cpu_op", "name": '"Input Dims"', "ts": 3, "dur": 1, "args": {"note": '"Input Dims"'}}
    elsewhere = {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 5, "args": {"Input Dims": [[1]]}}
    kernel = {**op, "cat": "kernel"}
    no_types = {**op, "args": {"Input Dims": [[2, 3], [3, 4]]}}
    null_types = {**op, "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": None}}
    null_dims = {**op, "args": {"Input Dims": None, "Input type": ["float"]}}
    for events, shapes in (([op], 1), ([as_name], 0), ([as_name, elsewhere], 0), ([as_name, op], 1), ([kernel], 0),
                           ([op, no_types, null_types, null_dims, op], 4)):
        raw = json.dumps(events).encode()
        assert _same_or_refused(raw), events
        ch = scan.scan_chunk(raw)
        assert ch is not None and len(ch.shape_rows) == shapes, events
    spaced = b'[' + json.dumps(op).encode() + b', ' + json.dumps(op, separators=(",", ":")).encode() + b']'
    assert _same_or_refused(spaced)
    ch = scan.scan_chunk(spaced)
    assert ch is not None and ch.shape_codes.tolist() == [0, 0]
    assert ch.shape_values == [(((2, 3), (3, 4)), ("float", "float"))]


# Keys one byte away from those the reader takes whole or looks up by length and last byte
_LOOKALIKE_KEYS = ["p", "phx", "Ph", "nam", "names", "nme", "pidd", "tsx", "t", "du", "durr", "i", "args2", "arg",
                   "cat ", " cat"]  # fmt: skip
_LOOKALIKE_ARGS = ["stroam", "devicx", "External ic", "Ext", "correlatioN", "Input Dimz", "bytez", "b", "E",
                   "Input typo", "input type", "Input Dim", "Input types", "xnput Dims", "Input Dimss", "s", "e"]
_SEPARATORS = [(", ", ": "), (",", ":"), (" , ", " : "), (",\n", ":\n\t"), (", ", ":  ")]


@native
@pytest.mark.parametrize("seed", range(3))
def test_keys_taken_whole_are_exactly_the_keys(seed):
    """The reader takes a key whole when its bytes match the key that followed the previous one last
    time (one word compared), and looks args keys up by length and last byte. Keys in shuffled
    orders, lookalike keys one byte off, odd spacing, and events cut short right after a key: equal
    to msgspec wherever the reader accepts, and most lists accepted."""
    rng = random.Random(seed)
    accepted = 0
    for _ in range(400):
        events = []
        for _ in range(rng.randrange(1, 12)):
            e: dict[str, Any] = {"ph": "X", "name": rng.choice(["a", "ab", "aten::mm", "k" * 9]),
                                 "cat": rng.choice(["kernel", "cpu_op"]),
                                 "pid": rng.randrange(5), "tid": 7, "ts": rng.randrange(10**16) / 10,
                                 "dur": 1.5, "args": {"External id": 3, "Ev Idx": 4, "stream": 7, "bytes": 8}}
            if rng.random() < 0.5:
                e["args"].update({"Input Dims": [[2, 3], [3, rng.randrange(1, 4)]], "Input type": ["float", "float"]})
            for _ in range(rng.randrange(3)):
                e[rng.choice(_LOOKALIKE_KEYS)] = rng.choice([1, "x", None, [2]])
            for _ in range(rng.randrange(3)):
                e["args"][rng.choice(_LOOKALIKE_ARGS)] = rng.choice([1, "x", None])
            keys = list(e)
            if rng.random() < 0.5:
                rng.shuffle(keys)
            events.append({k: e[k] for k in keys})
        item, key = rng.choice(_SEPARATORS)
        raw = "[" + item.join(json.dumps(e, separators=(item, key)) for e in events) + "]"
        if rng.random() < 0.2:  # cut right after a key, or a byte later: fewer than a word left
            cut = raw.rfind('"', 0, len(raw) - 2)
            raw = raw[: cut + rng.randrange(1, 3)]
        accepted += _same_or_refused(raw.encode())
    assert accepted > 250


@native
@pytest.mark.parametrize(
    "token",
    ["12345678", "1234567812345678", "1234567812345678901", "12345678123456789012", "0.00000000123456789",
     "0.1234567812345678", "1.00000000000000000001", "98765432.1", "87654321e-3", "12345678.87654321e2",
     "-1712195495519695.8", "1712195495519695", "0.000000012345678", "10000000000000000000000",
     "999999999999.99999999", "123456789012.12345678", "12345678901.123456789", "1234567890123.12345678"],
)  # fmt: skip
def test_long_digit_runs_are_read_eight_at_a_time_exactly(token):
    """Digits are read a word at a time while eight of them follow: at and around 8, 16 and 19
    digits, in fractions after leading zeros, and before an exponent, the double is Python's."""
    got = scan.scan_chunk(b'[{"ph":"X","ts":%s,"dur":1}]' % token.encode())
    assert got is not None and got.x["ts"].tolist() == [float(token)]


@native
def test_a_name_at_the_end_of_the_buffer_has_the_same_code():
    """A short name is hashed as one masked word when a word can be read there, else byte by byte
    (the end of the buffer is nearer): the same name must get the same code either way."""
    for name in ["a", "ab", "abcdefg", "abcdefgh", "abcdefghi"]:
        raw = json.dumps([{"ph": "X", "name": name}, {"ph": "X", "cat": "c", "name": name}],
                         separators=(",", ":")).encode()
        got = scan.scan_chunk(raw)
        assert got is not None and got.names == [name] and got.x["name"].tolist() == [0, 0], name


def test_decoded_shapes_are_kept_within_bounds() -> None:
    """Each distinct shape text is decoded once and kept, but a hostile file cannot grow the cache:
    long texts are decoded without being kept, and the cache holds a bounded number of pairs; a
    shape that does not decode (invalid UTF-8, which msgspec does not check in a raw value) is no
    shape, and the event stays."""
    dec._parse_shapes_cached.cache_clear()
    assert dec.parse_shapes(b"[[2, 3]]", b'["float"]') == (((2, 3),), ("float",))
    assert dec.parse_shapes(b"[[2, 3]]", b'["float"]') is dec.parse_shapes(b"[[2, 3]]", b'["float"]')
    long = b"[" + b",".join([b"[1]"] * 700) + b"]"  # over the bytes kept (and over MAX_INPUTS)
    assert len(long) > dec._CACHED_RAW and dec.parse_shapes(long, None) is None
    assert dec._parse_shapes_cached.cache_info().currsize == 1
    assert dec._parse_shapes_cached.cache_info().maxsize == dec._CACHED <= 4096
    assert dec.parse_shapes(b'[["\xff"]]', None) is None
    raw = b'[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1, "args": {"Input Dims": [["\xff"]]}}]'
    ch = dec.decode_chunk(raw, exact=True)
    assert len(ch.x["ts"]) == 1 and ch.skipped == 0 and ch.shape_rows.size == 0
    assert scan.scan_chunk(raw) is None  # the C reader refuses invalid UTF-8: msgspec decides
