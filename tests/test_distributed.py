"""A 2-process gloo DDP training profile of a tiny GPT on CPU: both ranks' records and the assembled run."""
from __future__ import annotations

import json

import pytest

from lmprof.config import TrainConfig
from lmprof.pipeline.distributed import failure_message
from lmprof.pipeline.train import run_training
from lmprof.record.run import Run


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp") / "run"
    cfg = TrainConfig(preset="tiny", n_layer=2, batch_size=2, seq_len=16, steps=2, warmup=1, profile_steps=1,
                      device="cpu", energy="off", nproc=2, plots=False)
    run, out = run_training(cfg, out_dir=folder)
    return run, out


@pytest.mark.slow
def test_both_ranks_recorded(ddp_run):
    run, folder = ddp_run
    for r in (0, 1):
        rank = Run.load(folder / f"rank{r}")
        assert rank.config["rank"] == r and rank.config["world_size"] == 2
        assert (folder / f"rank{r}" / "trace.json.gz").is_file()
        assert rank.metrics["step_time"].n == 2


def test_assembled_run_has_per_rank_figures(ddp_run):
    run, folder = ddp_run
    again = Run.load(folder)
    assert again.metrics["world_size"].value == 2
    rows = again.tables["ranks"]
    assert [r["rank"] for r in rows] == [0, 1]
    times = [r["step_time_ms"] for r in rows]
    slowest = again.metrics["slowest_rank"].value
    assert times[int(slowest)] == max(times)
    assert again.metrics["straggler"].value == pytest.approx(100 * (max(times) - min(times)) / min(times))
    assert json.loads((folder / "run.json").read_text())["files"]["trace"] == "rank0/trace.json.gz"


def test_allreduce_is_its_own_block(ddp_run):
    run, _ = ddp_run
    bwd = {b.name: b.time_ms for b in run.blocks if b.phase == "backward"}
    assert bwd.get("allreduce", 0) > 0
    # attribution stays exhaustive with DDP: parts add up to the clean step
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(run.metrics["step_time"].value, rel=0.1)


@pytest.mark.slow
def test_crashed_rank_is_named_and_nothing_hangs(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROF_FAKE_RANK_CRASH", "1")
    code, _, err = cli("train", "--nproc", "2", "--n-layer", "1", "--steps", "1", "--warmup", "0",
                       "--profile-steps", "1", "--device", "cpu", "--energy", "off", "--no-report", "--out", tmp_path)
    assert code == 2
    assert "rank 1" in err and "simulated crash" in err
    assert len(err.strip().splitlines()) == 1


def test_failure_message_from_torchrun_output():
    out = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File x\n"
           "[rank1]: RuntimeError: Connection closed by peer\nrank      : 1 (local_rank: 1)\n")
    assert failure_message(out, 1) == "distributed run failed on rank 1: RuntimeError: Connection closed by peer"


def test_analyze_reads_every_rank_of_the_run(ddp_run, cli):
    _, folder = ddp_run
    code, out, err = cli("analyze", folder, "--json")
    assert code == 0, err
    import json as _json

    report = _json.loads(out)
    assert len(report["traces"]) == 2 and report["ranks"]["slowest_rank"] in (0, 1)


@pytest.mark.slow
def test_hugging_face_model_under_ddp(tmp_path):
    pytest.importorskip("transformers")
    cfg = TrainConfig(hf_config="tiny-gpt2", batch_size=2, seq_len=16, steps=1, warmup=1, profile_steps=1,
                      device="cpu", energy="off", nproc=2, plots=False)
    run, folder = run_training(cfg, out_dir=tmp_path / "hfddp")
    assert run.metrics["world_size"].value == 2
    assert "mlp.fc" in {b.name for b in run.blocks if b.phase == "backward"}
    assert any(b.name == "allreduce" for b in run.blocks)


@pytest.mark.slow
def test_fsdp_shards_show_as_gather_and_reduce_blocks(tmp_path):
    cfg = TrainConfig(preset="tiny", n_layer=1, batch_size=2, seq_len=16, steps=1, warmup=1, profile_steps=1,
                      device="cpu", energy="off", nproc=2, parallel="fsdp", plots=False)
    run, folder = run_training(cfg, out_dir=tmp_path / "fsdp")
    names = {b.name for b in run.blocks}
    assert {"allgather", "allreduce"} <= names
    params = run.metrics["params"].value  # the model's parameter count, whole
    held = run.metrics["memory.params"].value  # bytes this rank holds: about half of the fp32 parameters
    assert 0.4 * params * 4 <= held <= 0.6 * params * 4
    assert sum(b.time_ms for b in run.blocks) == pytest.approx(run.metrics["step_time"].value, rel=0.1)


def _infer_rank(folder, e2e_ms: list[float], decode_tps: float) -> None:
    from lmprof.record.run import Env, Metric

    env = Env(device="cpu", device_name="test", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1)
    run = Run(id=folder.name, mode="infer", created="2026-01-01T00:00:00Z", env=env, config={},
              metrics={"e2e_latency": Metric.from_samples(e2e_ms, "ms", "measured"),
                       "decode_tokens_per_s": Metric(value=decode_tps, unit="tokens/s", source="derived")})
    run.save(folder)


def test_inference_ranks_assemble_by_generation_time(tmp_path):
    """`lmprof run --nproc 2 --infer`: ranks compared by their median generation time (hand figures)."""
    from lmprof.pipeline.distributed import assemble

    _infer_rank(tmp_path / "rank0", [100.0, 110.0, 120.0], 50.0)
    _infer_rank(tmp_path / "rank1", [150.0, 160.0, 130.0], 40.0)
    run = assemble(tmp_path, 2)
    assert [r["e2e_latency_ms"] for r in run.tables["ranks"]] == [110.0, 150.0]
    assert run.metrics["slowest_rank"].value == 1
    assert run.metrics["straggler"].value == pytest.approx(100 * (150 - 110) / 110)
    assert run.metrics["decode_tokens_per_s.global"].value == 90.0
    assert "tokens_per_s.global" not in run.metrics


def test_a_rank_without_its_time_is_a_clear_error(tmp_path):
    from lmprof.errors import DataError
    from lmprof.pipeline.distributed import assemble

    _infer_rank(tmp_path / "rank0", [100.0], 50.0)
    r1 = Run.load(tmp_path / "rank0")
    r1.metrics.pop("e2e_latency")
    r1.save(tmp_path / "rank1")
    with pytest.raises(DataError, match="rank1.*no e2e_latency"):
        assemble(tmp_path, 2)


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="reads /proc")
@pytest.mark.slow
def test_a_timed_out_torchrun_stops_its_ranks(tmp_path):
    """torchrun puts each rank in a session of its own: killing torchrun alone on a timeout left the
    ranks running. run_torchrun stops torchrun with SIGTERM, which stops the ranks first."""
    import os
    import subprocess
    import sys
    import time

    from lmprof.pipeline.distributed import run_torchrun

    script = tmp_path / "sleepy_rank.py"
    script.write_text("import os, pathlib, time\n"
                      f"pathlib.Path({str(tmp_path)!r}, 'started' + os.environ['RANK']).touch()\n"
                      "time.sleep(300)\n")
    # the agent lmprof launches (torchrun_command), so its stopping of the ranks is what is tested
    cmd = [sys.executable, "-m", "lmprof.pipeline.torchrun_agent", "--standalone", "--nproc-per-node=2", str(script)]
    with pytest.raises(subprocess.TimeoutExpired):
        run_torchrun(cmd, dict(os.environ), timeout_s=8, capture=True)
    assert (tmp_path / "started0").exists() and (tmp_path / "started1").exists()  # the ranks had started

    def alive() -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if str(script).encode() in f.read():
                        found.append(pid)
            except OSError:
                pass
        return found

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive() == []
