"""The NVIDIA driver's version in run.json's env (``env.driver``), which ``lmprof compare`` lists when two
runs differ in it. It was a field no lmprof run ever filled. Truth: NVML's own answer, through a stand-in
of the ``pynvml`` module with its functions (no GPU here), and NVML's reference counting kept whole."""
from __future__ import annotations

from types import SimpleNamespace

from lmprof.hardware.devices import environment, gpu_driver, resolve_device


class FakeNvml:
    def __init__(self, version: object = b"550.54.15", init_error: bool = False, query_error: bool = False):
        self.version, self.init_error, self.query_error = version, init_error, query_error
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise RuntimeError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlSystemGetDriverVersion(self) -> object:
        if self.query_error:
            raise RuntimeError("Uninitialized")
        return self.version

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def test_the_driver_version_as_nvml_gives_it_with_its_init_paired():
    for given, want in ((b"550.54.15", "550.54.15"), ("560.35.03", "560.35.03")):  # old pynvml: bytes; new: str
        nv = FakeNvml(given)
        assert gpu_driver(nv) == want
        assert nv.inits == nv.shutdowns == 1


def test_no_nvml_or_a_failing_query_is_none_and_never_raises():
    assert gpu_driver(FakeNvml(init_error=True)) is None
    failing = FakeNvml(query_error=True)
    assert gpu_driver(failing) is None and failing.shutdowns == 1
    assert gpu_driver(SimpleNamespace()) is None  # a module without NVML's functions


def test_a_cpu_run_has_no_driver_key():
    env = environment(resolve_device("cpu"))
    assert "driver" not in env and "cuda" not in env
