"""The peak table: figures, device-name matching, short names and user overrides."""
from __future__ import annotations

import pytest

from lmprof.errors import ConfigError
from lmprof.hardware.peaks import load_table

REQUIRED = [
    "v100-sxm2", "t4", "a10", "a100-pcie-40gb", "a100-pcie-80gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "l4", "l40s",
    "h100-pcie", "h100-sxm", "h200", "rtx-3090", "rtx-4090", "rtx-5090", "mi250x", "mi300x", "m1", "m2", "m3", "m4",
]


@pytest.fixture()
def table(monkeypatch, tmp_path):
    monkeypatch.delenv("LMPROF_PEAKS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    return load_table()


def test_table_is_versioned_and_sourced(table):
    assert table.version == "1"
    for key in REQUIRED:
        assert key in table.entries, key
    for e in table.entries.values():
        assert e.source and len(e.source) > 10, e.key
        assert e.bytes_per_s and e.bytes_per_s > 0, e.key


def test_datasheet_figures(table):
    h100 = table.entries["h100-sxm"]
    assert h100.flops_for("bf16") == pytest.approx(989e12, rel=0.001)  # dense, not the 1,979 sparse figure
    assert h100.bytes_per_s == 3.35e12
    a100 = table.entries["a100-sxm4-80gb"]
    assert (a100.flops_for("bf16"), a100.flops_for("fp32"), a100.flops_for("tf32")) == (312e12, 19.5e12, 156e12)
    assert a100.bytes_per_s == 2039e9 and table.entries["a100-sxm4-40gb"].bytes_per_s == 1555e9
    # GeForce: FP32-accumulate tensor rate (the FP16-accumulate one is twice that)
    assert table.entries["rtx-4090"].flops_for("fp16") == pytest.approx(165.2e12)
    assert table.entries["rtx-3090"].flops_for("bfloat16") == pytest.approx(71e12)
    # No bf16 on Volta: absent, not invented.
    assert table.entries["v100-sxm2"].flops_for("bf16") is None
    assert table.entries["m2"].flops_for("fp32") is None


@pytest.mark.parametrize(
    "torch_name, key",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("AMD Instinct MI250X/MI250", "mi250x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("Apple M1 Pro", "m1-pro"),
        ("Apple M1", "m1"),
        ("Apple M4 Max", "m4-max"),
        # different parts that must not borrow a neighbour's figures
        ("NVIDIA A10G", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", None),
        ("NVIDIA L40", None),
    ],
)
def test_torch_names(table, torch_name, key):
    entry = table.find(torch_name)
    assert (entry.key if entry else None) == key


def test_short_names_and_kind(table):
    assert table.find("h100").key == "h100-sxm"
    assert table.find("A100").key == "a100-sxm4-80gb"
    assert table.find("4090").key == "rtx-4090"
    assert table.find("h100", kind="cuda").key == "h100-sxm"
    assert table.find("Apple M2", kind="cpu") is None  # the CPU of an M2 is not its GPU
    assert table.find("Apple M2", kind="mps").key == "m2"
    assert table.find("") is None


def test_user_file_overrides_and_adds(monkeypatch, tmp_path):
    user = tmp_path / "peaks.yaml"
    user.write_text(
        "devices:\n"
        "  h100-sxm:\n"
        "    tflops: {bf16: 700}\n"
        "    source: my measured clocks\n"
        "  my-accel:\n"
        "    name: My Accelerator\n"
        "    kind: cuda\n"
        "    match: ['MyAccel']\n"
        "    tflops: {bf16: 100, fp32: 10}\n"
        "    bandwidth_gbs: 1000\n"
    )
    monkeypatch.setenv("LMPROF_PEAKS", str(user))
    t = load_table()
    h100 = t.entries["h100-sxm"]
    assert h100.flops_for("bf16") == 700e12
    assert h100.flops_for("fp8") == pytest.approx(1978.9e12)  # tflops merged per dtype
    assert h100.source == "my measured clocks" and h100.origin == str(user)
    mine = t.find("Vendor MyAccel 9000")
    assert mine.key == "my-accel" and mine.bytes_per_s == 1e12
    assert str(user) in mine.source  # no source given: the file is named
    assert "user" in t.version


def test_xdg_user_file(monkeypatch, tmp_path):
    monkeypatch.delenv("LMPROF_PEAKS", raising=False)
    (tmp_path / "lmprof").mkdir()
    (tmp_path / "lmprof" / "peaks.yaml").write_text("devices:\n  t4:\n    bandwidth_gbs: 300\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert load_table().entries["t4"].bytes_per_s == 300e9


@pytest.mark.parametrize(
    "text",
    ["devices: [1, 2]", "devices:\n  x:\n    tflops: {bf16: -1}\n", "devices:\n  x:\n    tflops: {int3: 1}\n",
     "devices:\n  x:\n    match: ['(']\n", ": : :"],
)
def test_bad_user_file(monkeypatch, tmp_path, text):
    user = tmp_path / "peaks.yaml"
    user.write_text(text)
    monkeypatch.setenv("LMPROF_PEAKS", str(user))
    with pytest.raises(ConfigError):
        load_table()


def test_missing_user_file(monkeypatch, tmp_path):
    monkeypatch.setenv("LMPROF_PEAKS", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError):
        load_table()


def test_mps_device_name_carries_the_chip_so_the_table_matches(monkeypatch):
    """resolve_device names an MPS device after the chip (sysctl), which the peak table knows."""
    import subprocess

    from lmprof.hardware import devices
    from lmprof.hardware.peaks import find_device

    class Done:
        stdout = "Apple M2 Max\n"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    name = f"{devices.apple_chip()} GPU (MPS)"
    assert name == "Apple M2 Max GPU (MPS)"
    assert find_device(name).key == "m2-max"
