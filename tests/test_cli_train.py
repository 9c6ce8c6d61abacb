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
        (["--steps", "0"], "must be positive"),
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
