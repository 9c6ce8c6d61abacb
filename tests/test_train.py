"""End-to-end training profile on the tiny preset (CPU): the parts add up and every block shows."""
from __future__ import annotations

import gzip
import json

import pytest

import lmprof
from lmprof.config import TrainConfig
from lmprof.pipeline.train import run_training
from lmprof.record.run import Run
from record_checks import assert_tables_documented, assert_valid

MATH_BLOCKS = ["embedding", "ln_1", "attn.qkv", "attn.scores", "attn.softmax", "attn.av", "attn.proj",
               "residual", "ln_2", "mlp.fc", "mlp.act", "mlp.proj", "ln_f", "lm_head", "loss"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    cfg = TrainConfig(preset="tiny", batch_size=4, seq_len=32, steps=5, warmup=2, profile_steps=2, device="cpu", energy="off")
    run, folder = run_training(cfg, out_dir=out)
    return run, folder


def test_parts_sum_to_clean_step(tiny_run):
    run, _ = tiny_run
    clean = run.metrics["step_time"].value
    profiled = run.metrics["profiled_step_time"]
    by_phase = {}
    for b in run.blocks:
        by_phase[b.phase] = by_phase.get(b.phase, 0.0) + b.time_ms
    assert set(by_phase) >= {"forward", "backward", "step"}
    assert sum(by_phase.values()) == pytest.approx(clean, rel=0.10)
    # The raw profiled parts add up to the mean profiled step (attribution is exhaustive).
    raw = sum(b.profiled_ms for b in run.blocks)
    steps = run.tables["attribution"][0]["profiled_step_ms"]
    assert raw == pytest.approx(sum(steps) / len(steps), rel=0.01)
    assert profiled.n == 2


def test_every_block_has_forward_and_backward_time(tiny_run):
    run, _ = tiny_run
    times = {(b.name, b.phase): b.time_ms for b in run.blocks}
    for name in MATH_BLOCKS:
        assert times.get((name, "forward"), 0) > 0, name
        assert times.get((name, "backward"), 0) > 0, name
    for part in ("optimizer", "zero_grad", "data"):
        assert times.get((part, "step"), 0) > 0, part


def test_metrics_have_units_and_sources(tiny_run):
    run, _ = tiny_run
    st = run.metrics["step_time"]
    assert st.unit == "ms" and st.source == "measured" and st.n == 5
    assert st.p10 <= st.value <= st.p90
    tps = run.metrics["tokens_per_s"]
    assert tps.unit == "tokens/s" and tps.source == "derived"
    assert tps.value == pytest.approx(4 * 32 / (st.value / 1e3), rel=0.2)
    assert run.metrics["params"].value == 834432  # tiny preset, counted by hand in test_gpt.py


def test_run_folder_round_trips_and_trace_opens(tiny_run):
    run, folder = tiny_run
    for name in ("run.json", "blocks.csv", "ops.csv", "trace.json.gz"):
        assert (folder / name).is_file(), name
    again = Run.load(folder)
    assert again.metrics["step_time"].value == run.metrics["step_time"].value
    raw = json.loads((folder / "run.json").read_text())
    assert raw["schema"] == "lmprof.run/1" and raw["mode"] == "train"
    assert {"device", "device_name", "torch", "cpu", "threads", "lmprof"} <= set(raw["env"])
    with gzip.open(folder / "trace.json.gz") as fh:
        trace = json.load(fh)
    assert any(e.get("name", "").startswith("lmprof:attn.qkv") for e in trace["traceEvents"])
    header = (folder / "blocks.csv").read_text().splitlines()[0]
    assert header.startswith("name,phase,time_ms,profiled_ms,pct")


def test_ops_table_matches_profiler_counts(tiny_run):
    run, _ = tiny_run
    ops = {o.name: o for o in run.ops}
    # 4 layers x (qkv, proj, fc, proj) linear layers with bias -> 16 addmm per forward.
    assert ops["aten::addmm"].calls == 16


@pytest.mark.slow
def test_compiled_model_profiles_without_recompiling(tmp_path, request):
    """torch.compile: sub-block scopes stay off (a flag flip would force a recompile in the
    profiled phase); compiled kernels' time goes to their blocks, fused kernels split among theirs.
    The batch is large enough (16 x 128) that kernels, not the compiled wrapper's fixed host cost
    (guards, the graph call, allocations: about 0.5 ms a phase here, shown as 'other'), dominate.

    The model is the stopwatch stage's (test_compiled_sdpa_step_is_in_named_blocks: SDPA attention,
    the same sizes), so that test, run alone after this stage, finds these graphs in inductor's
    cache instead of compiling them cold on one core. Compiled math attention is covered by the
    inference test (test_infer.py)."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    # One thread: on a shared machine, OpenMP workers waiting on a descheduled peer would land in
    # the untraced gaps between kernels ('other') and make the 90% check a test of the machine's load.
    request.addfinalizer(lambda n=torch.get_num_threads(): torch.set_num_threads(n))
    torch.set_num_threads(1)
    cfg = TrainConfig(preset="tiny", n_layer=1, attention="sdpa", batch_size=16, seq_len=128, steps=2, warmup=2,
                      profile_steps=1, device="cpu", energy="off", compile=True)
    from torch._dynamo.utils import counters

    counters.clear()
    run, _ = run_training(cfg, out_dir=tmp_path / "c")
    assert run.config["compile"] is True
    assert any("torch.compile" in n for n in run.notes)
    assert not any("no forward op" in n for n in run.notes)
    # Compiled kernels named by their blocks: the record is in the run folder, and the matmul
    # blocks (extern calls) and fused rows show in both phases.
    assert (tmp_path / "c" / "compiled_kernels.json").is_file()
    for phase in ("forward", "backward"):
        rows = {b.name for b in run.blocks if b.phase == phase}
        assert {"attn.qkv", "mlp.fc", "mlp.proj", "mlp.act", "ln_1"} <= rows, rows
        assert not any("+" in name for name in rows), rows  # fused kernels are split among their blocks
    # At least 90% of the model's time (forward + backward) is in named blocks, not 'other'.
    model = [b for b in run.blocks if b.phase in ("forward", "backward")]
    named = sum(b.time_ms for b in model if b.name not in ("other", "autograd_engine"))
    assert named >= 0.9 * sum(b.time_ms for b in model), [(b.name, b.phase, b.time_ms) for b in model]
    # Fused kernels: listed with their split, and the blocks they fed carry a fused_ms share of their time.
    fused = run.tables["fused_kernels"]
    assert fused and all(len(r["blocks"]) >= 2 and abs(sum(r["shares"]) - 1) < 1e-5 for r in fused)
    assert all(b.fused_ms is not None and 0 <= b.fused_ms <= b.time_ms + 1e-9 for b in run.blocks)
    assert any(b.fused_ms > 0 for b in run.blocks if b.name == "mlp.act")
    assert "fused ms" in lmprof.summary(run)
    assert_valid(tmp_path / "c" / "run.json")  # compile and fused_kernels rows, as published and documented
    assert_tables_documented(tmp_path / "c" / "run.json")
    # The FLOPs weighed per kernel at compile time add up to FlopCounterMode's count of the eager
    # model's forward and backward (the same shapes): inductor fuses and reorders, it does not change
    # matmuls. The eager model computes attention as plain matmuls (torch counts those: QK^T and AV
    # forward, four backward); the compiled one calls the fused SDPA kernel, whose backward also
    # recomputes the scores: one more matmul of 2*B*H*T*T*D, by hand.
    from torch.utils.flop_counter import FlopCounterMode

    from lmprof.workloads.gpt import GPT, preset

    graphs = json.loads((tmp_path / "c" / "compiled_kernels.json").read_text())["graphs"]
    recorded = [sum(sum(k["flops"]) for k in g["kernels"]) for g in graphs]
    eager_cfg = preset("tiny", n_layer=1)
    eager = GPT(eager_cfg)
    assert eager_cfg.attention == "math"
    x = torch.randint(65, (16, 128))
    with FlopCounterMode(display=False) as fwd:
        loss = eager(x, x)[1]
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    b, t, h = 16, 128, eager_cfg.n_head
    recompute = 2 * b * h * t * t * (eager_cfg.n_embd // h)
    assert recorded == [pytest.approx(fwd.get_total_flops()), pytest.approx(bwd.get_total_flops() + recompute)]
    assert counters["frames"]["total"] == 1  # the forward compiled once: no recompilation when profiling
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(run.metrics["step_time"].value, rel=0.1)
    # The compile record: the forward frame (and its backward graph, unless inductor's caches had it),
    # all in warm-up, nothing after.
    kinds = [(r["kind"], r["phase"]) for r in run.tables["compile"]]
    assert kinds[0] == ("compile", "warm-up") and set(kinds) <= {("compile", "warm-up"), ("backward", "warm-up")}
    assert run.value("compile.recompiles") == 0 and run.value("compile.graph_breaks") == 0
    assert run.value("compile.per_step") == 0
    # The first step (stopwatch) paid for compiling: far longer than a steady clean step.
    assert run.value("compile.time") > 5 * run.value("step_time")
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_run_that_recompiles_every_step_is_flagged_with_the_reason(tmp_path):
    """Each step's batch has a new length and the loss is compiled with dynamic=False, so every
    step recompiles (dynamo's eager backend: the events are the same, the test stays fast)."""
    import itertools

    import torch
    import torch._dynamo

    from lmprof.analysis.advice import advise
    from lmprof.hardware.devices import resolve_device
    from lmprof.pipeline.train import measure_training
    from lmprof.workloads.training import TrainWorkload

    torch._dynamo.reset()
    model = torch.nn.Linear(4, 4)
    lengths = itertools.count(2)
    batches = (torch.randn(next(lengths), 4) for _ in itertools.count())
    loss = torch.compile(lambda m, x: m(x).square().mean(), backend="eager", dynamic=False)
    work = TrainWorkload(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), batches=batches,
                         device=resolve_device("cpu"), loss_fn=loss)
    cfg = TrainConfig(steps=3, warmup=1, profile_steps=1, device="cpu", energy="off", compile=True, plots=False)
    run = measure_training(work, cfg, tmp_path / "r", {"compile": True})
    measured = [r for r in run.tables["compile"] if r["phase"] == "measured"]
    assert len(measured) == 3 and all(r["kind"] == "recompile" for r in measured)
    assert all("size mismatch at index 0" in r["reason"] for r in measured)
    assert run.value("compile.per_step") == 1.0
    assert any("recompiles every step" in n for n in run.notes)
    assert "recompiles" in {r.rule for r in advise(run)}
    torch._dynamo.reset()


@pytest.mark.slow  # compiles a forward and a backward graph on the CPU
@pytest.mark.stopwatch  # with a second test worker compiling beside it, it once lost every block: run alone
def test_compiled_sdpa_step_is_in_named_blocks(tmp_path, request):
    """torch.compile with --attention sdpa on the CPU: inductor calls the flash attention kernel as a
    fallback op (``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``), which runs as an
    aten op under the graph call like an extern matmul. Before, it was taken for a generated C++
    kernel, no graph call matched its record, and 76-78% of the step sat in 'compiled_call'."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    request.addfinalizer(lambda n=torch.get_num_threads(): torch.set_num_threads(n))
    torch.set_num_threads(1)  # see test_compiled_model_profiles_without_recompiling
    cfg = TrainConfig(preset="tiny", n_layer=1, attention="sdpa", batch_size=16, seq_len=128, steps=2, warmup=2,
                      profile_steps=1, device="cpu", energy="off", compile=True, plots=False)
    run, _ = run_training(cfg, out_dir=tmp_path / "c")
    for phase in ("forward", "backward"):
        rows = {b.name for b in run.blocks if b.phase == phase}
        assert {"attn.qkv", "attn.sdpa", "mlp.fc", "mlp.proj", "ln_1"} <= rows, rows
    named = sum(b.time_ms for b in run.blocks if b.name not in ("other", "compiled_call", "autograd_engine"))
    assert named >= 0.9 * sum(b.time_ms for b in run.blocks), [(b.name, b.phase, b.time_ms) for b in run.blocks]
    torch._dynamo.reset()


@pytest.mark.parametrize("arch,blocks", [("tiny-gpt2", {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "lm_head"}),
                                         ("tiny-llama", {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "rope"})])
def test_hugging_face_training_is_attributed_per_block(tmp_path, arch, blocks):
    pytest.importorskip("transformers")
    cfg = TrainConfig(hf_config=arch, batch_size=2, seq_len=16, steps=2, warmup=1, profile_steps=1,
                      device="cpu", energy="off", plots=False)
    run, _ = run_training(cfg, out_dir=tmp_path / "hf")
    fwd = {b.name for b in run.blocks if b.phase == "forward"}
    bwd = {b.name for b in run.blocks if b.phase == "backward"}
    assert blocks <= fwd
    assert (blocks - {"rope"}) <= bwd  # rotary embeddings have no parameters to differentiate
    assert run.config["hf"] == arch and run.config["model_source"] == "config (random weights)"
    assert run.metrics["mfu"].source == "derived"  # n/a or a value, always labelled
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(run.metrics["step_time"].value, rel=0.1)


def test_hugging_face_training_rejects_char_data(cli, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 50)
    code, _, err = cli("train", "--hf-config", "tiny-gpt2", "--data", text, "--device", "cpu")
    assert code == 2 and "synthetic tokens" in err
