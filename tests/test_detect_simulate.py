"""``--simulate`` specs: good ones build the machine they describe, bad ones name the bad part."""

from __future__ import annotations

import pytest

from clover_local.detect import metal_working_set, parse_simulate
from clover_local.detect.units import GIB, parse_size
from clover_local.errors import UsageError


def test_defaults_describe_a_cpu_only_16g_machine() -> None:
    m = parse_simulate("")
    assert m.simulated
    assert m.memory.total_bytes == 16 * GIB
    assert m.memory.available_bytes == 16 * GIB - 16 * GIB // 10  # 10% > 1.5 GiB
    assert m.cpu.physical_cores == 8
    assert m.disk.free_bytes == 500 * GIB
    assert m.gpus == ()
    assert m.build.backends == ("cpu",) and not m.build.gpu_offload
    assert m.offload_backend == "cpu"
    assert m.hints == ()


def test_small_ram_keeps_at_least_1_5_gib_for_the_os() -> None:
    m = parse_simulate("ram=8G")
    assert m.memory.available_bytes == 8 * GIB - 3 * GIB // 2


def test_nvidia_gpus_are_listed_separately_with_free_equal_total() -> None:
    m = parse_simulate("ram=32G, gpu=nvidia:12G, gpu=nvidia:24G, cpu=16, disk=1T")
    assert [g.total_bytes for g in m.gpus] == [12 * GIB, 24 * GIB]
    assert [g.free_bytes for g in m.gpus] == [12 * GIB, 24 * GIB]
    assert [g.index for g in m.gpus] == [0, 1]
    assert all(g.vendor == "nvidia" and g.source == "simulated" and not g.unified for g in m.gpus)
    assert m.memory.total_bytes == 32 * GIB
    assert m.cpu.physical_cores == m.cpu.logical_cores == 16
    assert m.disk.free_bytes == 1024 * GIB
    assert m.build.gpu_offload and m.build.backends == ("cuda", "cpu")
    assert m.offload_backend == "cuda"


@pytest.mark.parametrize(
    ("spec", "backend"),
    [
        ("gpu=amd:16G", "rocm"),
        ("gpu=intel:16G", "vulkan"),
        ("unified=64G", "metal"),
        ("gpu=amd:16G,backend=vulkan", "vulkan"),
    ],
)
def test_backend_follows_the_gpu_vendor_unless_given(spec: str, backend: str) -> None:
    m = parse_simulate(spec)
    assert m.offload_backend == backend
    assert m.build.gpu_offload


@pytest.mark.parametrize(
    ("ram_gib", "limit_gib", "rule"),
    [(16, 16 * 2 / 3, "2/3"), (36, 24, "2/3"), (64, 48, "3/4"), (128, 96, "3/4")],
)
def test_unified_memory_uses_the_metal_working_set_rule(ram_gib: int, limit_gib: float, rule: str) -> None:
    m = parse_simulate(f"unified={ram_gib}G")
    (gpu,) = m.gpus
    assert gpu.vendor == "apple" and gpu.unified
    assert (
        gpu.total_bytes
        == gpu.free_bytes
        == int(ram_gib * GIB * (2 if rule == "2/3" else 3) // (3 if rule == "2/3" else 4))
    )
    assert abs(gpu.total_bytes / GIB - limit_gib) < 1e-6
    assert rule in gpu.note
    assert (gpu.total_bytes, gpu.note) == metal_working_set(ram_gib * GIB)
    assert m.memory.total_bytes == ram_gib * GIB
    assert m.unified_memory and m.cpu.arch == "arm64" and m.os == "darwin"


def test_cpu_only_build_with_a_cuda_card_gets_the_rebuild_hint() -> None:
    m = parse_simulate("gpu=nvidia:24G,backend=cpu")
    assert m.offload_backend == "cpu"
    (hint,) = m.hints
    assert (
        'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
        in hint
    )


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("32G", 32 * GIB),
        ("32GiB", 32 * GIB),
        ("32gb", 32 * GIB),
        ("1.5T", 1536 * GIB),
        ("512M", 512 * 1024**2),
        ("4K", 4096),
        ("1073741824", GIB),
        ("abc", None),
        ("1.5", None),
        ("-1G", None),
        ("12X", None),
    ],
)
def test_sizes_are_binary(text: str, size: int | None) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("ram=lots", "ram=lots"),
        ("gpu=apple:16G", "gpu=apple:16G"),
        ("gpu=nvidia", "gpu=nvidia"),
        ("gpu=nvidia:0", "gpu=nvidia:0"),
        ("vram=12G", "vram=12G"),
        ("ram=16G,ram=32G", "ram=32G"),
        ("backend=opencl", "backend=opencl"),
        ("cpu=many", "cpu=many"),
        ("cpu=0", "cpu=0"),
        ("unified=64G,gpu=nvidia:8G", "unified=64G"),
        ("unified=64G,ram=32G", "ram=32G"),
        ("ram", "ram"),
        ("disk=", "disk="),
        ("gpu=nvidia:12G@fast", "gpu=nvidia:12G@fast"),
        ("gpu=nvidia:12G@936", "gpu=nvidia:12G@936"),
    ],
)
def test_bad_specs_name_the_bad_part_and_the_accepted_forms(spec: str, named: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_simulate(spec)
    assert f"{named!r}" in info.value.what
    assert "gpu=nvidia:12G" in (info.value.fix or "")


def test_a_gpu_can_be_described_with_its_memory_bandwidth() -> None:
    m = parse_simulate("gpu=nvidia:12G@4.8TB/s,gpu=nvidia:16G@936GB/s,gpu=amd:24G")
    assert [g.bandwidth_bytes_per_s for g in m.gpus] == [4.8e12, 936e9, None]
    assert [g.total_bytes for g in m.gpus] == [12 * GIB, 16 * GIB, 24 * GIB]
