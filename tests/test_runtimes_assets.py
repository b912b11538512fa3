"""The archive chooser's other half: the target a described machine is (OS, CPU, the backends its GPUs and driver
can use), and what no real release offers. The picks from real releases' asset lists are in
``test_runtimes_real_releases.py``."""

from __future__ import annotations

import pynvml
import pytest
from helpers_detect import RecordedNvml
from helpers_runtimes import assets_of

from clover_local.detect.machine import Cpu, Disk, Gpu, Machine, Memory
from clover_local.detect.nvidia import cuda_driver_version
from clover_local.runtimes.assets import Target, choose_archive, target_for

TAG = "b11459"
CURRENT = assets_of(TAG)
"""The newest real release's assets (``tests/data/llamacpp_releases``); every release's picks are checked in
``test_runtimes_real_releases.py``."""


@pytest.mark.parametrize(
    "target",
    [
        Target("linux", "riscv64", ("cpu",)),  # no such build
        Target("macos", "arm64", ("cuda-12",)),
        Target("windows", "x64", ("metal",)),
        Target("linux", "x64", ("sycl",)),  # not a backend chosen here
        Target("linux", "arm64", ("cuda-12",)),  # CUDA 12 is built for x64 only
    ],
)
def test_nothing_fits_means_none(target: Target) -> None:
    assert choose_archive(CURRENT, TAG, target) is None


def test_an_archive_of_another_tag_is_never_chosen() -> None:
    assert choose_archive(assets_of("b10144"), TAG, Target("linux", "x64", ("cpu",))) is None


def _machine(os_name: str, arch: str, *vendors: str) -> Machine:
    gpus = tuple(Gpu(i, v, f"{v} gpu", 8 << 30, 8 << 30) for i, v in enumerate(vendors))  # type: ignore[arg-type]
    return Machine(
        cpu=Cpu("cpu", 4, 8, arch=arch),
        memory=Memory(16 << 30, 12 << 30),
        disk=Disk("/", 100 << 30, 50 << 30),
        gpus=gpus,
        os=os_name,
    )


@pytest.mark.parametrize(
    ("machine", "driver", "backend", "expected"),
    [
        (_machine("linux", "x86_64"), None, None, Target("linux", "x64", ("cpu",))),
        (_machine("linux", "aarch64"), None, None, Target("linux", "arm64", ("cpu",))),
        (_machine("darwin", "arm64", "apple"), None, None, Target("macos", "arm64", ("metal",))),
        (_machine("darwin", "x86_64"), None, None, Target("macos", "x64", ("cpu",))),
        (
            _machine("linux", "x86_64", "nvidia"),
            (13, 0),
            None,
            Target("linux", "x64", ("cuda-13", "cuda-12", "vulkan")),
        ),
        (_machine("linux", "x86_64", "nvidia"), (12, 4), None, Target("linux", "x64", ("cuda-12", "vulkan"))),
        (_machine("linux", "x86_64", "nvidia"), None, None, Target("linux", "x64", ("cuda-12", "vulkan"))),
        (
            _machine("windows", "AMD64", "nvidia"),
            (13, 1),
            None,
            Target("windows", "x64", ("cuda-13", "cuda-12", "vulkan")),
        ),
        (_machine("linux", "x86_64", "amd"), None, None, Target("linux", "x64", ("rocm", "vulkan"))),
        (_machine("linux", "x86_64", "intel"), None, None, Target("linux", "x64", ("vulkan",))),
        (_machine("linux", "x86_64", "nvidia"), (13, 0), "cpu", Target("linux", "x64", ("cpu",))),
        (
            _machine("linux", "x86_64", "nvidia"),
            (13, 0),
            "cuda",
            Target("linux", "x64", ("cuda-13", "cuda-12")),
        ),
        (_machine("linux", "x86_64"), None, "vulkan", Target("linux", "x64", ("vulkan",))),
    ],
)
def test_the_target_of_a_machine(
    machine: Machine, driver: tuple[int, int] | None, backend: str | None, expected: Target
) -> None:
    target = target_for(machine, cuda_driver=driver, backend=backend)
    assert (target.os, target.arch, target.backends) == (expected.os, expected.arch, expected.backends)
    assert target.why


def test_a_cuda_12_driver_never_gets_a_cuda_13_build() -> None:
    target = target_for(_machine("linux", "x86_64", "nvidia"), cuda_driver=(12, 8))
    choice = choose_archive(CURRENT, TAG, target)
    assert choice is not None and choice.backend == "cuda-12"


class _NvmlWithDriver(RecordedNvml):
    def __init__(self, cuda_version: int | None) -> None:
        super().__init__([])
        self.cuda_version = cuda_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        if self.cuda_version is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.cuda_version


@pytest.mark.parametrize(
    ("nvml", "expected"),
    [
        (_NvmlWithDriver(13000), (13, 0)),
        (_NvmlWithDriver(12040), (12, 4)),
        (_NvmlWithDriver(None), None),  # an NVML too old for the call
        (RecordedNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), None),
        (None, None),  # no nvidia-ml-py
    ],
)
def test_the_cuda_version_the_driver_supports(nvml: object, expected: tuple[int, int] | None) -> None:
    assert cuda_driver_version(nvml) == expected
