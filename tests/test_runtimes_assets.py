"""The archive chooser, as a table: real asset names of llama.cpp releases (the ``release.yml`` of
ggml-org/llama.cpp names them ``llama-<tag>-bin-<os>[-<variant>]-<arch>``; the CUDA runtimes ship apart as
``cudart-...``), and machines described with ``--simulate``-style values."""

from __future__ import annotations

import pynvml
import pytest
from helpers_detect import RecordedNvml

from clover_local.detect.machine import Cpu, Disk, Gpu, Machine, Memory
from clover_local.detect.nvidia import cuda_driver_version
from clover_local.runtimes.assets import Target, choose_archive, target_for

TAG = "b7000"
# The assets of a recent release (the Linux CUDA builds and their cudart archives arrived in late 2026).
CURRENT = [
    f"cudart-llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",
    "cudart-llama-bin-win-cuda-12.4-x64.zip",
    "cudart-llama-bin-win-cuda-13.3-x64.zip",
    f"llama-{TAG}-bin-macos-arm64.tar.gz",
    f"llama-{TAG}-bin-macos-x64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-arm64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-cuda-12.8-x64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-openvino-2026.0-x64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-rocm-7.2-x64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-s390x.tar.gz",
    f"llama-{TAG}-bin-ubuntu-sycl-fp16-x64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-vulkan-arm64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-vulkan-x64.tar.gz",
    f"llama-{TAG}-bin-ubuntu-x64.tar.gz",
    f"llama-{TAG}-bin-win-cpu-arm64.zip",
    f"llama-{TAG}-bin-win-cpu-x64.zip",
    f"llama-{TAG}-bin-win-cuda-12.4-x64.zip",
    f"llama-{TAG}-bin-win-cuda-13.3-x64.zip",
    f"llama-{TAG}-bin-win-hip-radeon-x64.zip",
    f"llama-{TAG}-bin-win-opencl-adreno-arm64.zip",
    f"llama-{TAG}-bin-win-vulkan-x64.zip",
    f"llama-{TAG}-ui.tar.gz",
    f"llama-{TAG}-xcframework.zip",
]
# An older release: Linux builds zipped, no Linux CUDA, Windows CPU builds by instruction set.
OLDER = [
    "llama-b4282-bin-ubuntu-x64.zip",
    "llama-b4282-bin-macos-arm64.zip",
    "llama-b4282-bin-win-avx2-x64.zip",
    "llama-b4282-bin-win-avx512-x64.zip",
    "llama-b4282-bin-win-vulkan-x64.zip",
    "llama-b4282-bin-win-cuda-cu12.2.0-x64.zip",
    "cudart-llama-bin-win-cu12.2.0-x64.zip",
]


@pytest.mark.parametrize(
    ("names", "tag", "target", "asset", "extras", "backend"),
    [
        (CURRENT, TAG, Target("linux", "x64", ("cpu",)), f"llama-{TAG}-bin-ubuntu-x64.tar.gz", (), "cpu"),
        (CURRENT, TAG, Target("linux", "arm64", ("cpu",)), f"llama-{TAG}-bin-ubuntu-arm64.tar.gz", (), "cpu"),
        (CURRENT, TAG, Target("linux", "s390x", ("cpu",)), f"llama-{TAG}-bin-ubuntu-s390x.tar.gz", (), "cpu"),
        (
            CURRENT,
            TAG,
            Target("linux", "x64", ("vulkan",)),
            f"llama-{TAG}-bin-ubuntu-vulkan-x64.tar.gz",
            (),
            "vulkan",
        ),
        (
            CURRENT,
            TAG,
            Target("linux", "x64", ("cuda-13", "cuda-12", "vulkan")),
            f"llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",
            (f"cudart-llama-{TAG}-bin-ubuntu-cuda-13.4-x64.tar.gz",),
            "cuda-13",
        ),
        (
            CURRENT,
            TAG,
            Target("linux", "x64", ("cuda-12", "vulkan")),
            f"llama-{TAG}-bin-ubuntu-cuda-12.8-x64.tar.gz",
            (),  # this release ships no CUDA 12.8 runtime archive for Linux: the system's libraries are used
            "cuda-12",
        ),
        (
            CURRENT,
            TAG,
            Target("linux", "x64", ("rocm", "vulkan")),
            f"llama-{TAG}-bin-ubuntu-rocm-7.2-x64.tar.gz",
            (),
            "rocm",
        ),
        (
            CURRENT,
            TAG,
            Target("linux", "arm64", ("rocm", "vulkan")),  # no ROCm build for arm64: Vulkan
            f"llama-{TAG}-bin-ubuntu-vulkan-arm64.tar.gz",
            (),
            "vulkan",
        ),
        (
            CURRENT,
            TAG,
            Target("macos", "arm64", ("metal",)),
            f"llama-{TAG}-bin-macos-arm64.tar.gz",
            (),
            "metal",
        ),
        (CURRENT, TAG, Target("macos", "x64", ("cpu",)), f"llama-{TAG}-bin-macos-x64.tar.gz", (), "cpu"),
        (CURRENT, TAG, Target("windows", "x64", ("cpu",)), f"llama-{TAG}-bin-win-cpu-x64.zip", (), "cpu"),
        (CURRENT, TAG, Target("windows", "arm64", ("cpu",)), f"llama-{TAG}-bin-win-cpu-arm64.zip", (), "cpu"),
        (
            CURRENT,
            TAG,
            Target("windows", "x64", ("cuda-13", "cuda-12")),
            f"llama-{TAG}-bin-win-cuda-13.3-x64.zip",
            ("cudart-llama-bin-win-cuda-13.3-x64.zip",),
            "cuda-13",
        ),
        (
            CURRENT,
            TAG,
            Target("windows", "x64", ("cuda-12",)),
            f"llama-{TAG}-bin-win-cuda-12.4-x64.zip",
            ("cudart-llama-bin-win-cuda-12.4-x64.zip",),
            "cuda-12",
        ),
        (
            CURRENT,
            TAG,
            Target("windows", "x64", ("rocm",)),
            f"llama-{TAG}-bin-win-hip-radeon-x64.zip",
            (),
            "rocm",
        ),
        (
            CURRENT,
            TAG,
            Target("windows", "x64", ("vulkan",)),
            f"llama-{TAG}-bin-win-vulkan-x64.zip",
            (),
            "vulkan",
        ),
        (OLDER, "b4282", Target("linux", "x64", ("cpu",)), "llama-b4282-bin-ubuntu-x64.zip", (), "cpu"),
        (
            OLDER,
            "b4282",
            Target("macos", "arm64", ("metal",)),
            "llama-b4282-bin-macos-arm64.zip",
            (),
            "metal",
        ),
        (OLDER, "b4282", Target("windows", "x64", ("cpu",)), "llama-b4282-bin-win-avx2-x64.zip", (), "cpu"),
        (
            OLDER,
            "b4282",
            Target("windows", "x64", ("cuda-12",)),
            "llama-b4282-bin-win-cuda-cu12.2.0-x64.zip",
            ("cudart-llama-bin-win-cu12.2.0-x64.zip",),
            "cuda-12",
        ),
        (
            OLDER,
            "b4282",
            Target("linux", "x64", ("cuda-12", "vulkan")),  # neither on Linux then
            None,
            (),
            None,
        ),
    ],
)
def test_the_archive_for_each_target(
    names: list[str],
    tag: str,
    target: Target,
    asset: str | None,
    extras: tuple[str, ...],
    backend: str | None,
) -> None:
    choice = choose_archive(names, tag, target)
    if asset is None:
        assert choice is None
        return
    assert choice is not None
    assert (choice.asset, choice.extras, choice.backend) == (asset, extras, backend)


@pytest.mark.parametrize(
    "target",
    [
        Target("linux", "riscv64", ("cpu",)),  # no such build
        Target("macos", "arm64", ("cuda-12",)),
        Target("windows", "x64", ("metal",)),
        Target("linux", "x64", ("sycl",)),  # not a backend chosen here
    ],
)
def test_nothing_fits_means_none(target: Target) -> None:
    assert choose_archive(CURRENT, TAG, target) is None


def test_an_archive_of_another_tag_is_never_chosen() -> None:
    assert (
        choose_archive(["llama-b6999-bin-ubuntu-x64.tar.gz"], TAG, Target("linux", "x64", ("cpu",))) is None
    )


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
