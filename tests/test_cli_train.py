"""`lmprof train` from the command line: bad input is one line and exit code 2; options work."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--batch-size", "-1"], "batch size must be positive"),
        (["--n-embd", "100", "--n-head", "3"], "divisible by n_head"),
        (["--preset", "huge"], "unknown preset"),
        (["--device", "tpu"], "unknown device"),
        (["--device", "cuda"], "no CUDA GPU"),
        (["--data", "/no/such/file.txt"], "data file not found"),
        (["--batch-size", "abc"], "--batch-size"),
        (["--dtype", "fp8"], "dtype"),
        (["--config", "/no/such.yaml"], "config file not found"),
        (["--seq-len", "999"], "exceeds the model's block_size"),
        (["--steps", "0"], "steps: must be at least 1, got 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, args, needle):
    code, out, err = cli("train", "--out", "/tmp/lmprof-never", *args)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out


def test_yaml_config_and_text_data(cli, tmp_path):
    text = tmp_path / "shakespeare.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20)
    cfg = tmp_path / "my.yaml"
    cfg.write_text(f"preset: tiny\nbatch-size: 2\nseq_len: 16\nsteps: 2\nwarmup: 1\nprofile_steps: 1\n"
                   f"attention: sdpa\ndata: {text}\ndevice: cpu\nenergy: off\n")
    code, out, err = cli("train", "--config", cfg, "--out", tmp_path / "runs")
    assert code == 0, err
    assert "attn.sdpa" in out and "loss" in out
    assert "run folder:" in out
    # the report is on (the default), so the run's PNGs are drawn for it; with --no-report, none
    folder = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert {"memory.png", "report.html"} <= {p.name for p in folder.iterdir()}  # (no roofline: no CPU peak here)
    code, _, err = cli("train", "--config", cfg, "--out", tmp_path / "quiet", "--no-report")
    assert code == 0, err
    assert not list((tmp_path / "quiet").glob("*/*.png"))


def test_unknown_yaml_key_is_an_error(cli, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("preset: tiny\nbatchsize: 2\n")
    code, _, err = cli("train", "--config", cfg)
    assert code == 2 and "batchsize" in err


def test_bf16_autocast_on_cpu(cli, tmp_path):
    code, out, err = cli("train", "--dtype", "bf16", "--batch-size", "2", "--seq-len", "16", "--steps", "2",
                         "--warmup", "1", "--profile-steps", "1", "--device", "cpu", "--out", tmp_path)
    assert code == 0, err
    assert "bf16" in out


@pytest.mark.parametrize("args", [["train", "--batch-size", "0"], ["train", "--preset", "huge"],
                                  ["infer", "--new-tokens", "-1"], ["train", "--out", "/dev/null/x"],
                                  ["memory", "--preset", "tiny", "--device", "cpu"], ["memory", "--model", "nope"],
                                  ["train", "--device", "tpu"], ["infer", "--device", "cuda:x"],
                                  ["calibrate", "--device", "nope"]])
def test_refusals_and_estimates_import_no_torch(args):
    """A bad value is said before torch is imported (one line in a quarter of a second, not 2 s), and
    ``lmprof memory`` estimates without torch at all (the estimate is torch-free)."""
    import subprocess
    import sys

    code = ("import sys\nfrom lmprof.cli.main import main\n"
            f"rc = main({args!r})\nprint('RESULT', rc, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert result and result[0].split()[2] == "False", (proc.stdout[-500:], proc.stderr[-500:])
    assert result[0].split()[1] == ("0" if args[0] == "memory" and "--preset" in args else "2"), proc.stderr
