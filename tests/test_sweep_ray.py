"""Sweeps on a local Ray instance: results flow back into the same store; failures stay per point."""
from __future__ import annotations

import signal

import pandas as pd
import pytest

from lazy_imports import Lazy, missing
from lmprof.record.store import load_results
from lmprof.record.run import Run
from lmprof.sweep.ray_executor import RayExecutor, cpu_share, resources_for, threads_for
from lmprof.sweep.runner import run_sweep
from lmprof.sweep.spec import SweepSpec

pytestmark = [missing("ray", "ray is not installed"), pytest.mark.slow]
ray = Lazy("ray")  # imported by the test that runs, not by every worker's collection


def spec(**kw):
    base = dict(models=[{"name": "mini", "n_layer": 1, "n_head": 2, "n_embd": 32}], batch_sizes=[2], seq_lens=[16],
                modes=["train"], devices=["cpu"], steps=1, warmup=0, profile_steps=1, energy="off", timeout_s=120)
    base.update(kw)
    return SweepSpec.model_validate(base)


def test_ray_sweep_commits_every_point_and_isolates_a_failure(tmp_path):
    s = spec(models=[{"name": "mini", "n_layer": 1, "n_head": 2, "n_embd": 32},
                     {"name": "bad", "n_layer": 1, "n_head": 3, "n_embd": 32}])
    ex = RayExecutor(init_kwargs={"num_cpus": 2, "num_gpus": 0, "object_store_memory": 80 * 1024 * 1024})
    before = signal.getsignal(signal.SIGTERM)
    summary = run_sweep(s, tmp_path / "out", executor=ex)
    assert summary.counts == {"ok": 1, "error": 1}
    df = load_results(tmp_path / "out")
    by_model = dict(zip(df["model"], df["status"]))
    assert by_model == {"mini": "ok", "bad": "error"}
    assert "divisible" in df.loc[df["model"] == "bad", "message"].iloc[0]
    assert not ray.is_initialized()  # the executor shut down the Ray it started
    assert signal.getsignal(signal.SIGTERM) is before  # and left the process's SIGTERM handler as it was
    # One node of 2 CPUs: each point had the whole node, one at a time (each worker's own start and end,
    # to the store's second), the run on 2 threads as its record says (Ray alone would have run both
    # points at once, on one thread each).
    ok = df[df["status"] == "ok"]
    assert [Run.load(tmp_path / "out" / d).env.threads for d in ok["run_dir"]] == [2]
    finished = pd.to_datetime(df["finished"])
    (a, b) = sorted(zip(finished - pd.to_timedelta(df["duration_s"], unit="s"), finished))
    assert b[0] >= a[1] - pd.Timedelta(seconds=1), (a, b)


def test_cpu_share_and_threads():
    assert cpu_share([8.0, 4.0], None) == 4.0  # a whole (smallest) node per point
    assert cpu_share([8.0], 2) == 2 and threads_for(2.5) == 2 and threads_for(0.5) == 1
    for asked, needle in ((16, "no Ray node has that many"), (0, "positive"), (float("nan"), "positive")):
        with pytest.raises(Exception, match=needle):
            cpu_share([8.0], asked)
    point = spec().expand().points[0]
    assert resources_for(point, cluster_has_gpu=False, cpus=4.0) == {"num_gpus": 0, "num_cpus": 4.0}


def test_ray_resources_follow_the_device():
    cuda = spec(devices=["cuda"]).expand().points[0]
    cpu = spec(devices=["cpu"]).expand().points[0]
    auto = spec(devices=["auto"]).expand().points[0]
    assert resources_for(cuda, cluster_has_gpu=False)["num_gpus"] == 1
    assert resources_for(cpu, cluster_has_gpu=True)["num_gpus"] == 0
    assert resources_for(auto, cluster_has_gpu=True)["num_gpus"] == 1
    assert resources_for(auto, cluster_has_gpu=False)["num_gpus"] == 0
