"""Nsight Systems exports through ``lmprof analyze``: totals against direct SQL sums on real exports,
NVTX ranges as annotations, NCCL kernels as communication, blocks from llm.c's markers and from a
user's map, and hostile files (one line, exit 2)."""
from __future__ import annotations

import json
import shutil
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.trace.fanout import analyze_path
from lmprof.trace.nsys import load_nsys
from lmprof.trace.nsys.names import nvtx_event, runtime_name
from nsys_export import PID, Export

DATA = Path(__file__).parent / "data" / "nsys"
H100 = DATA / "h100_2gpu_cut.sqlite"
MFU = DATA / "mfu_2gpu_cut.sqlite"


def sql(path: Path, query: str, *args: object) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


def sql_write(path: Path, *statements: str) -> None:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()


_PROC = "((globalPid >> 24) & 16777215)"


def _device_sql(path: Path, proc: int) -> dict[str, tuple[int, float]]:
    """Per table: rows and summed duration (us) of one process's device activity, by SQL alone."""
    out = {}
    for t in ("KERNEL", "MEMCPY", "MEMSET"):
        n, ns = sql(path, f"SELECT count(*), coalesce(sum(end - start), 0) FROM CUPTI_ACTIVITY_KIND_{t} "
                          f"WHERE {_PROC} = ?", proc)[0]
        out[t] = (n, ns / 1e3)
    return out


@pytest.mark.parametrize("path", [H100, MFU], ids=["h100", "mfu"])
def test_kernel_and_copy_totals_equal_sql_sums(path):
    rep = analyze_path(path)
    procs = [p for (p,) in sql(path, f"SELECT DISTINCT {_PROC} FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]
    assert [t.process for t in rep.traces] == procs and len(procs) == 2
    for tr in rep.traces:
        truth = _device_sql(path, tr.process)
        dev = tr.device
        assert dev.window.rule == "all device events"  # no steps: every device event counts
        assert dev.kernels.count == sum(n for n, _ in truth.values())
        assert dev.kernels.total_us == pytest.approx(sum(us for _, us in truth.values()), rel=1e-12)
        kernels_us = dev.kernels.by_type_us["computation"] + dev.kernels.by_type_us["communication"]
        assert kernels_us == pytest.approx(truth["KERNEL"][1], rel=1e-12)
        assert dev.kernels.by_type_us["memory"] == pytest.approx(truth["MEMCPY"][1] + truth["MEMSET"][1], rel=1e-12)
        # copies: bytes and time per direction, as SQL groups them
        copies = {c.kind: c for c in dev.hardware.copies}
        for kind, n, nbytes, ns in sql(path, "SELECT copyKind, count(*), sum(bytes), sum(end - start) FROM "
                                             f"CUPTI_ACTIVITY_KIND_MEMCPY WHERE {_PROC} = ? GROUP BY 1", tr.process):
            name = {1: "HtoD", 2: "DtoH", 8: "DtoD"}[kind]
            rows = [c for k, c in copies.items() if k.startswith(f"Memcpy {name}")]
            assert sum(c.count for c in rows) == n and sum(c.bytes for c in rows) == nbytes
            assert sum(c.time_us for c in rows) == pytest.approx(ns / 1e3, rel=1e-12)
        # launches: every kernel linked to its runtime call through correlationId, as SQL joins them
        (linked,) = sql(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                              "ON r.correlationId = k.correlationId AND ((r.globalTid >> 24) & 16777215) = "
                              f"{_PROC.replace('globalPid', 'k.globalPid')} WHERE {_PROC.replace('globalPid', 'k.globalPid')} = ?",
                        tr.process)[0]
        assert dev.launches.linked + dev.launches.graph_kernels == linked


def test_json_has_the_kineto_schema(capsys):
    from test_trace_analyze import _check_schema

    assert main(["analyze", str(MFU), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _check_schema(doc)
    assert all(t["blocks"] is None for t in doc["traces"])  # no preset's markers, no map


def test_nccl_kernels_are_communication_and_ranks_are_matched():
    rep = analyze_path(MFU)
    for tr in rep.traces:
        (n, ns), = sql(MFU, "SELECT count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                            f"ON s.id = k.shortName WHERE s.value LIKE 'nccl%' AND {_PROC} = ?", tr.process)
        assert n > 0
        assert tr.device.communication.collectives == n
        assert tr.device.kernels.by_type_us["communication"] == pytest.approx(ns / 1e3, rel=1e-12)
        assert {g.kind for g in tr.device.communication.groups} == {"sendrecv"}
    assert rep.ranks is not None and [r.rank for r in rep.ranks.ranks] == [0, 1]
    assert rep.collectives is not None and rep.collectives.matched > 0


def test_nvtx_ranges_are_nested_annotations_and_emit_nvtx_ranges_operators():
    rep = analyze_path(MFU)
    tr = rep.traces[0]
    rows = {r.path: r for r in tr.annotations.rows}
    # the NCCL domain's ranges sit inside PyTorch's record_function scope nccl:all_to_all
    truth = sql(MFU, "SELECT count(*), sum(end - start) FROM NVTX_EVENTS WHERE text LIKE 'nccl:all_to_all%' "
                     "AND ((globalTid >> 24) & 16777215) = ?", tr.process)[0]
    top = rows["nccl:all_to_all"]
    assert (top.count, top.depth) == (truth[0], 0)
    assert top.total_us == pytest.approx(truth[1] / 1e3, rel=1e-12)
    inner = rows["nccl:all_to_all > ncclGroupEnd"]
    assert inner.depth == 1 and inner.count == truth[0]
    # emit_nvtx's "aten::addmm, op_id = N" ranges are operators named as in a Kineto trace
    (n_addmm,) = sql(MFU, "SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'aten::addmm,%' "
                          "AND ((globalTid >> 24) & 16777215) = ?", tr.process)[0]
    ops = {o.name: o for o in tr.operators.top}
    assert ops["aten::addmm"].count == n_addmm


def test_names_follow_kineto():
    assert nvtx_event("aten::mm, seq = 12, op_id = 5, sizes = [[2, 3], [3, 4]], input_op_ids = [1]") == (
        "aten::mm", "cpu_op", 12)
    assert nvtx_event("aten::view, op_id = 314290") == ("aten::view", "cpu_op", -1)
    assert nvtx_event("FSDP::pre_forward (blocks.9), op_id = 7") == ("FSDP::pre_forward (blocks.9)", "user_annotation", -1)
    assert nvtx_event("nccl:all_reduce, op_id = 7")[1] == "user_annotation"
    assert nvtx_event("autograd::engine::evaluate_function: MmBackward0, seq = 3, op_id = 9")[1:] == ("cpu_op", 3)
    assert nvtx_event("Layer 3") == ("Layer 3", "user_annotation", -1)
    assert nvtx_event("Train step 7")[0] == "ProfilerStep#7"
    assert nvtx_event("a, b, c") == ("a, b, c", "user_annotation", -1)
    assert runtime_name("cudaStreamGetCaptureInfo_v2_v11030") == "cudaStreamGetCaptureInfo_v2"
    # a hostile name: a million ", " pieces are read in one pass (a regex tried at every comma was quadratic)
    assert nvtx_event("x" + ", y" * 1_000_000)[1] == "user_annotation"


# ------------------------------------------------------------------- llm.c's markers, event by event


def llmc_export(tmp_path: Path, steps: int = 2, layers: int = 2) -> tuple[Path, dict[str, list[int]]]:
    """An llm.c-shaped capture: per step, gpt2_forward (encoder, Layer N with its launcher functions and
    a bare kernel), gpt2_backward_and_reduce (layers in reverse), gpt2_update. Returns the file and,
    per block path, the durations (ns) of the kernels written inside it at any depth."""
    x = Export()
    inside: dict[str, list[int]] = defaultdict(list)
    t = 1_000_000
    dur = iter(range(5_000, 10**9, 137))  # distinct kernel durations

    def kernel(name: str, paths: list[str]) -> None:
        nonlocal t
        d = next(dur)
        x.launch(name, t, d)
        for p in paths:
            inside[p].append(d)
        t += 3_000 + d + 500

    def rng(text: str, body) -> None:
        nonlocal t
        t0 = t
        t += 200
        body()
        t += 200
        x.nvtx(text, t0, t)

    for s in range(steps):
        def forward() -> None:
            rng("encoder_forward", lambda: kernel("encoder_forward_kernel3", ["forward", "forward > embedding"]))
            for layer in range(layers):
                def body() -> None:
                    lp = "forward > layer"
                    rng("matmul_cublaslt", lambda: kernel("sm90_xmma_gemm", ["forward", lp, lp + " > matmul"]))
                    rng("attention_forward_cudnn", lambda: kernel("cudnn_generated_fort_native_sdpa",
                                                                  ["forward", lp, lp + " > attn.sdpa"]))
                    kernel("fused_residual_forward_kernel5", ["forward", lp])
                rng(f"Layer {layer}", body)

        def backward() -> None:
            for layer in reversed(range(layers)):
                def body() -> None:
                    lp = "backward > layer"
                    rng("attention_backward_cudnn", lambda: kernel("cudnn_generated_bwd_sdpa",
                                                                   ["backward", lp, lp + " > attn.sdpa"]))
                    rng("matmul_backward", lambda: kernel("sm90_xmma_gemm_bwd", ["backward", lp, lp + " > matmul"]))
                rng(f"Layer {layer}", body)

        def step() -> None:
            rng("gpt2_forward", forward)
            rng("gpt2_backward_and_reduce", backward)
            rng("gpt2_update", lambda: kernel("adamw_kernel3", ["optimizer"]))

        rng(f"Train step {s}", step)
    return x.write(tmp_path / "llmc.sqlite"), inside


def test_llmc_markers_give_blocks_steps_and_critical_path(tmp_path):
    path, inside = llmc_export(tmp_path)
    (tr,) = analyze_path(path).traces
    assert tr.device_name == "NVIDIA H100 80GB HBM3"
    assert tr.steps is not None and tr.steps.count == 2  # "Train step N" ranges are the steps
    assert tr.critical_path is not None
    b = tr.blocks
    assert b is not None and b.source == "llm.c"
    rows = {r.path: r for r in b.rows}
    assert set(rows) == set(inside)
    # the last step's device work is left out (HTA's rule, as for Kineto traces): the window is step 1
    for p, durs in inside.items():
        half = len(durs) // 2
        assert rows[p].device_us == pytest.approx(sum(durs[:half]) / 1e3), p
        assert rows[p].device_events == half
    # ranges are counted as the window counts device work: those of the steps before the last
    assert rows["forward > layer"].calls == 2 and rows["forward > layer"].forward_calls == 2
    assert rows["backward > layer"].backward_calls == 2 and rows["backward > layer"].forward_calls == 0
    top = sum(r.device_us for r in b.rows if r.depth == 0)
    assert top + b.unattributed_us == pytest.approx(b.device_us)
    assert b.device_us == pytest.approx(tr.device.kernels.total_us)


def test_block_flops_with_model(tmp_path, capsys):
    from lmprof.analysis.block_flops import block_flops
    from lmprof.estimate.flops import block_costs
    from lmprof.estimate.models import resolve_model

    path, inside = llmc_export(tmp_path)
    (tr,) = analyze_path(path, include_last_step=True).traces
    entry = resolve_model("gpt2")
    bf = block_flops(tr.blocks, entry.name, entry.shape, 4, 64)
    rows = {r.path: (r, f) for r, f in zip(tr.blocks.rows, bf.rows)}
    fwd = {c.name: c for c in block_costs(entry.shape, batch=4, seq_len=64, phase="forward", attention="sdpa")}
    bwd = {c.name: c for c in block_costs(entry.shape, batch=4, seq_len=64, phase="backward", attention="sdpa")}
    r, f = rows["forward > layer > attn.sdpa"]
    assert r.forward_calls == 4 and f.flops == pytest.approx(4 * fwd["attn.sdpa"].flops / entry.shape.n_layer)
    assert f.achieved_flops_per_s == pytest.approx(f.flops / (sum(inside["forward > layer > attn.sdpa"]) * 1e-9))
    r, f = rows["backward > layer > attn.sdpa"]
    assert f.flops == pytest.approx(4 * bwd["attn.sdpa"].flops / entry.shape.n_layer)
    r, f = rows["forward"]
    assert f.flops == pytest.approx(2 * sum(c.flops for c in
                                            block_costs(entry.shape, batch=4, seq_len=64, phase="forward")))
    assert rows["forward > layer > matmul"][1].flops is None  # which matmul it is, the marker does not say
    # the CLI prints them, and its JSON holds them per block path
    assert main(["analyze", str(path), "--model", "gpt2", "--batch", "4", "--seq-len", "64", "--json",
                 "--include-last-step"]) == 0
    doc = json.loads(capsys.readouterr().out)
    from test_trace_analyze import _check_units

    _check_units(doc)  # every float named with its unit, block rows and FLOPs included
    got = {r["path"]: r for r in doc["traces"][0]["block_flops"]["rows"]}
    assert got["forward > layer > attn.sdpa"]["flops"] == pytest.approx(rows["forward > layer > attn.sdpa"][1].flops,
                                                                         rel=1e-6)
    assert main(["analyze", str(path), "--model", "gpt2"]) == 2
    assert "--batch and --seq-len" in capsys.readouterr().err


def test_blocks_from_a_users_map(tmp_path, capsys):
    # real export: the user's map names emit_nvtx's FlashAttnFunc ranges and FSDP's per-layer scopes
    (tmp_path / "map.yaml").write_text('"FlashAttnFunc": attn.sdpa\n"FSDP::pre_forward (*)": "*"\n')
    assert main(["analyze", str(MFU), "--blocks", str(tmp_path / "map.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for tr in doc["traces"]:
        rows = {r["path"]: r for r in tr["blocks"]["rows"]}
        proc = tr["process"]
        # SQL: kernels whose launching call lies inside a FlashAttnFunc range of the same thread
        (n, ns), = sql(MFU, """
            SELECT count(*), coalesce(sum(k.end - k.start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
              AND ((r.globalTid >> 24) & 16777215) = ((k.globalPid >> 24) & 16777215)
            WHERE ((k.globalPid >> 24) & 16777215) = ? AND EXISTS (
              SELECT 1 FROM NVTX_EVENTS n WHERE n.globalTid = r.globalTid AND n.start <= r.start
                AND n.end >= r.end AND n.text LIKE 'FlashAttnFunc,%')""", proc)
        assert n > 0
        assert rows["attn.sdpa"]["device_events"] == n
        assert rows["attn.sdpa"]["device_us"] == pytest.approx(ns / 1e3, abs=1e-3)
        assert any(p.startswith("blocks.") and p.endswith("_checkpoint_wrapped_module") for p in rows)
        assert tr["blocks"]["source"].endswith("map.yaml")


@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "mapping"),
    ('"Layer *": [a]', "block name"),
    ('"Layer ?*": "*"', "exactly one"),
])
def test_bad_block_maps_are_one_line(tmp_path, capsys, text, why):
    (tmp_path / "m.yaml").write_text(text)
    assert main(["analyze", str(MFU), "--blocks", str(tmp_path / "m.yaml")]) == 2
    err = capsys.readouterr().err
    assert why in err and err.count("\n") == 1 and "Traceback" not in err


def test_export_diff_and_refused_annotate(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    import pandas as pd

    path, _ = llmc_export(tmp_path)
    assert main(["analyze", str(MFU), "--export", str(tmp_path / "tables")]) == 0
    capsys.readouterr()
    k = pd.read_parquet(tmp_path / "tables" / "kernels.parquet")
    (n,) = sql(MFU, "SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL) + (SELECT count(*) FROM "
                    "CUPTI_ACTIVITY_KIND_MEMCPY) + (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET)")[0]
    assert len(k) == n and set(k["rank"]) == {0, 1}
    assert main(["analyze", "--diff", str(path), str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == []
    assert main(["analyze", "--diff", str(path), str(MFU)]) == 2
    assert "2 processes" in capsys.readouterr().err
    assert main(["analyze", str(path), "--annotate", str(tmp_path / "a.json")]) == 2
    assert "Nsight Systems export" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()


# --------------------------------------------------------------------------------------- hostile files


def _one_line(capsys, *args: str) -> str:
    assert main(["analyze", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmprof: error: ") and err.count("\n") == 1, err
    return err


def test_hostile_exports_are_one_line(tmp_path, capsys):
    text = tmp_path / "report.sqlite"
    text.write_text("not a database at all\n")
    assert "not an SQLite file" in _one_line(capsys, str(text))
    header_only = tmp_path / "header.sqlite"
    header_only.write_bytes(b"SQLite format 3\x00" + b"\x00" * 84)
    _one_line(capsys, str(header_only))
    other = tmp_path / "other.sqlite"
    sql_write(other, "CREATE TABLE foo (a INTEGER)")
    assert "not an Nsight Systems export" in _one_line(capsys, str(other))
    cut = tmp_path / "truncated.sqlite"
    cut.write_bytes(MFU.read_bytes()[: MFU.stat().st_size // 3])
    _one_line(capsys, str(cut))
    empty = Export().write(tmp_path / "empty.sqlite")  # every table, no rows
    assert "no events" in _one_line(capsys, str(empty))
    stripped = tmp_path / "stripped.sqlite"
    shutil.copy(MFU, stripped)
    sql_write(stripped, "DELETE FROM StringIds")
    assert "StringIds" in _one_line(capsys, str(stripped))
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    err = _one_line(capsys, str(rep))
    assert "nsys is not on PATH" in err and "nsys export --type sqlite" in err


def test_odd_values_are_left_out_with_a_note(tmp_path):
    x = Export()
    end = x.launch("gemm", 10_000, 5_000)
    x.launch("gemm", end + 1_000, 7_000)
    x.nvtx("never ended", 5_000, None)
    path = x.write(tmp_path / "odd.sqlite", gpu=None)
    sql_write(path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 1",
              "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'x' WHERE rowid = 2")
    (t,) = load_nsys(path)
    assert any("CUPTI_ACTIVITY_KIND_KERNEL: 1 rows" in n for n in t.notes)
    assert any("NVTX_EVENTS: 1 ranges never ended" in n for n in t.notes)
    (tr,) = analyze_path(path).traces
    assert tr.device.kernels.count == 1 and tr.device.launches.linked == 0  # its call's id was junk
    assert tr.process == PID


def test_odd_paths(tmp_path):
    odd = tmp_path / "we[i]rd $dir" / "a b\udcff.sqlite"
    odd.parent.mkdir()
    shutil.copy(MFU, odd)
    assert len(analyze_path(odd).traces) == 2
    (tmp_path / "folder").mkdir()
    shutil.copy(MFU, tmp_path / "folder" / "r.sqlite")
    (tmp_path / "folder" / "r.nsys-rep").write_bytes(b"\x00")  # its export is there: not read twice
    assert len(analyze_path(tmp_path / "folder").traces) == 2


def test_both_readers_fill_the_same_columns():
    """The id and hardware columns are named once (lmprof.trace.fields): an export's tables have the
    columns, in the same order, of a Kineto trace's; and the names load neither reader."""
    import subprocess
    import sys

    from lmprof.trace.load import load_trace

    kineto = load_trace(Path(__file__).parent / "data" / "traces" / "gpu_2rank_rank0.json.gz")
    for t in load_nsys(H100):
        assert t.event_cols.columns == kineto.event_cols.columns
        assert t.hw_cols.columns == kineto.hw_cols.columns and len(t.hw_cols) > 0
    code = "import sys, lmprof.trace.fields; print(sorted(m for m in sys.modules if m.startswith('lmprof.trace.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "kineto" not in loaded and "nsys" not in loaded and "lmprof.trace.fields" in loaded
