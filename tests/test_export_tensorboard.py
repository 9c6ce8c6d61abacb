"""lmprof export --to tensorboard, read back with tensorboard's own EventAccumulator (offline)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from export_fixtures import make_run, png_bytes, write_run, write_sweep
from lmprof.cli.main import main

from lazy_imports import missing  # noqa: E402

pytestmark = missing("tensorboard", "the tensorboard extra is not installed")


def _load(logdir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_equal_run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run-a")
    assert main(["export", str(run_dir), "--to", "tensorboard", "--dest", str(tmp_path / "tb")]) == 0
    assert "tensorboard:" in capsys.readouterr().out
    acc = _load(tmp_path / "tb" / "run-a")
    truth = make_run()
    scalars = {tag: acc.Scalars(tag)[0].value for tag in acc.Tags()["scalars"]}
    # Each figure under its name with the unit in it; n/a figures are not logged.
    assert scalars["step_time_ms"] == pytest.approx(truth.metrics["step_time"].value)
    assert scalars["tokens_per_s"] == pytest.approx(truth.metrics["tokens_per_s"].value)
    assert scalars["mfu_pct"] == pytest.approx(12.25)
    assert scalars["memory.peak_B"] == pytest.approx(123456789.0, rel=1e-7)  # float32 in event files
    assert scalars["params"] == pytest.approx(834432.0)
    assert not any(t.startswith("energy") for t in scalars)
    # Each block's time a scalar of its own (the fixture's 12.5 ms x 0.25 and x 0.75).
    assert scalars["blocks/attn.qkv/forward_ms"] == pytest.approx(3.125)
    assert scalars["blocks/mlp.fc/backward_ms"] == pytest.approx(9.375)
    # Plots: the PNG bytes as written.
    img = acc.Images("plots/roofline")[0]
    assert img.encoded_image_string == png_bytes() and (img.width, img.height) == (3, 2)
    # Tables and config as text.
    text = {t: acc.Tensors(t)[0].tensor_proto.string_val[0].decode() for t in acc.Tags()["tensors"] if t.endswith("text_summary")}
    blocks = next(v for k, v in text.items() if k.startswith("blocks"))
    assert "| attn.qkv | forward | 3.125 |" in blocks
    config = next(v for k, v in text.items() if k.startswith("config"))
    assert "| model.n_layer | 2 |" in config
    # The report and trace beside the events.
    assert (tmp_path / "tb" / "run-a" / "artifacts" / "report.html").is_file()
    assert (tmp_path / "tb" / "run-a" / "artifacts" / "trace.json.gz").is_file()


def test_a_second_export_replaces_the_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run-a")
    for _ in range(2):
        assert main(["export", str(run_dir), "--to", "tensorboard", "--dest", str(tmp_path / "tb")]) == 0
    assert "(updated)" in capsys.readouterr().out
    logdir = tmp_path / "tb" / "run-a"
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1
    assert len(_load(logdir).Scalars("step_time_ms")) == 1  # one point, not one per export


def test_sweep_is_one_run_per_point_in_one_group(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "my-sweep")
    assert main(["export", str(sweep), "--to", "tensorboard", "--dest", str(tmp_path / "tb")]) == 0
    for point, ms in (("p0", 10.0), ("p1", 20.0)):
        acc = _load(tmp_path / "tb" / "my-sweep" / point)
        assert acc.Scalars("step_time_ms")[0].value == pytest.approx(ms)


def test_not_a_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path), "--to", "tensorboard"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["export", str(tmp_path), "--to", "comet"]) == 2
    assert "unknown tracker 'comet'" in capsys.readouterr().err


def test_log_to_on_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmprof import progress
    from lmprof.record.run import Run

    monkeypatch.chdir(tmp_path)  # --log-to writes to the tracker's default destination, ./tensorboard
    seen: list[progress.Progress] = []
    with progress.listening(seen.append):
        assert main(["train", "--preset", "tiny", "--batch-size", "2", "--seq-len", "16", "--steps", "2", "--warmup",
                     "1", "--profile-steps", "1", "--energy", "off", "--no-report", "--out", "runs",
                     "--log-to", "tensorboard"]) == 0
    # Progress (tests/test_progress.py draws it): warm-up 1 + the figures step + 2 clean + the profiler's
    # warm-up + 1 profiled, each counted.
    assert [(e.done, e.total) for e in seen if e.stage == "step"] == [(i, 6) for i in range(1, 7)]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run = Run.load(run_dir)
    acc = _load(tmp_path / "tensorboard" / run.id)
    assert acc.Scalars("step_time_ms")[0].value == pytest.approx(run.metrics["step_time"].value)


def test_log_to_unknown_tracker_stops_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "runs"), "--log-to", "comet"]) == 2
    assert "unknown tracker 'comet'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
