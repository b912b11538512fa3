"""Each probe fed recorded outputs: NVML values, sysfs trees, macOS sysctl, /proc/cpuinfo, build info."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from helpers_detect import DATA, RecordedNvml, mac_inputs, no_gpu_inputs, recorded, write_sysfs

from clover_local.detect import detect_machine
from clover_local.detect.amd import probe_amd_sysfs, probe_amdsmi
from clover_local.detect.apple import apple_gpu, metal_working_set
from clover_local.detect.build import probe_build
from clover_local.detect.cpu import probe_cpu_linux
from clover_local.detect.intel import probe_intel_sysfs
from clover_local.detect.memory import probe_disk
from clover_local.detect.nvidia import probe_nvidia
from clover_local.detect.units import GIB

MIB = 1024**2


def _metal_build() -> tuple[SimpleNamespace, str]:
    """A Metal build of llama-cpp-python as llama_cpp reports it (no ctypes registry: system info is parsed)."""
    module = SimpleNamespace(
        __version__="0.3.36",
        llama_supports_gpu_offload=lambda: True,
        llama_print_system_info=lambda: (
            b"MTL : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | ACCELERATE = 1 | "
        ),
    )
    return module, ""


# NVIDIA ---------------------------------------------------------------------------------------------------


def test_nvml_reports_each_gpu_with_its_own_free_memory_and_bandwidth() -> None:
    nvml = RecordedNvml(recorded("nvml_rtx4090_rtx3090.json")["devices"])
    gpus, result = probe_nvidia(nvml)
    assert result.ok and "2 GPU(s)" in result.detail
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090"]
    assert [g.total_bytes for g in gpus] == [25757220864, 25769803776]
    assert [g.free_bytes for g in gpus] == [23386193920, 25425346560]  # per GPU, not summed, not total
    assert [g.index for g in gpus] == [0, 1]
    assert all(g.vendor == "nvidia" and g.source == "nvml" and not g.unified for g in gpus)
    # 384-bit bus x 10501 MHz x 2 (DDR) / 8 = 1008 GB/s; 384-bit x 9751 MHz -> 936 GB/s
    assert gpus[0].bandwidth_bytes_per_s == pytest.approx(1008.1e9, rel=1e-3)
    assert gpus[1].bandwidth_bytes_per_s == pytest.approx(936.1e9, rel=1e-3)
    assert nvml.shutdowns == 1


def test_nvml_without_bus_width_leaves_bandwidth_unknown() -> None:
    devices = [dict(recorded("nvml_rtx4090_rtx3090.json")["devices"][0])]
    del devices[0]["bus_width"]
    gpus, _ = probe_nvidia(RecordedNvml(devices))
    assert gpus[0].bandwidth_bytes_per_s is None
    assert gpus[0].free_bytes == 23386193920


def test_nvml_driver_missing_is_no_nvidia_gpu_with_the_reason() -> None:
    gpus, result = probe_nvidia(RecordedNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert gpus == [] and not result.ok
    assert "Driver Not Loaded" in result.detail


def test_nvml_not_installed_is_no_nvidia_gpu() -> None:
    gpus, result = probe_nvidia(None)
    assert gpus == [] and not result.ok and "nvidia-ml-py" in result.detail


# AMD and Intel through sysfs --------------------------------------------------------------------------------


def test_amd_dgpu_from_sysfs(tmp_path: Path) -> None:
    gpus, result = probe_amd_sysfs(write_sysfs(tmp_path, "amd_rx7900xtx"))
    (gpu,) = gpus
    assert result.ok
    assert gpu.vendor == "amd" and gpu.name == "AMD Radeon RX 7900 XTX" and gpu.source == "sysfs"
    assert gpu.total_bytes == 25753026560
    assert gpu.free_bytes == 25753026560 - GIB


def test_amd_apu_carveout_is_not_vram(tmp_path: Path) -> None:
    gpus, result = probe_amd_sysfs(write_sysfs(tmp_path, "amd_apu_with_carveout"))
    assert gpus == [] and not result.ok
    assert "512.0 MiB carve-out" in result.detail and "not counted as VRAM" in result.detail


def test_intel_arc_with_vram_files(tmp_path: Path) -> None:
    gpus, result = probe_intel_sysfs(write_sysfs(tmp_path, "intel_arc_a770"))
    (gpu,) = gpus
    assert result.ok and gpu.vendor == "intel" and "8086:56a0" in gpu.name
    assert (gpu.total_bytes, gpu.free_bytes) == (17079205888, 17079205888 - 384 * MIB)


def test_intel_arc_on_xe_reports_total_and_says_free_is_assumed(tmp_path: Path) -> None:
    (gpu,), result = probe_intel_sysfs(write_sysfs(tmp_path, "intel_arc_b580_xe"))
    assert gpu.total_bytes == gpu.free_bytes == 12 * GIB
    assert "free assumed = total" in gpu.note and "free assumed" in result.detail


def test_intel_igpu_is_not_counted(tmp_path: Path) -> None:
    gpus, result = probe_intel_sysfs(write_sysfs(tmp_path, "intel_igpu_only"))
    assert gpus == [] and not result.ok
    assert "integrated GPU sharing system RAM; not counted as VRAM" in result.detail


def test_amdsmi_reports_megabytes_per_gpu() -> None:
    calls: list[str] = []
    amdsmi = SimpleNamespace(
        amdsmi_init=lambda: calls.append("init"),
        amdsmi_shut_down=lambda: calls.append("shutdown"),
        amdsmi_get_processor_handles=lambda: ["h0", "h1"],
        amdsmi_get_gpu_vram_usage=lambda h: {"vram_total": 196592 if h == "h0" else 512, "vram_used": 283},
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI300X"},
    )
    gpus, result = probe_amdsmi(amdsmi)
    (gpu,) = gpus  # the 512 MB device is an APU carve-out
    assert (gpu.total_bytes, gpu.free_bytes) == (196592 * MIB, (196592 - 283) * MIB)
    assert gpu.source == "amdsmi" and result.ok and calls == ["init", "shutdown"]


# Apple Silicon -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mac", "ram_gib", "limit_bytes", "rule"),
    [
        ("m3_pro_36g", 36, 24 * GIB, "2/3 of RAM"),
        ("m2_max_64g", 64, 48 * GIB, "3/4 of RAM"),
        ("m4_max_128g", 128, 96 * GIB, "3/4 of RAM"),
        ("m4_max_128g_wired", 128, 114688 * MIB, "iogpu.wired_limit_mb=114688"),
        ("m2_max_64g_wired", 64, 56 * GIB, "iogpu.wired_limit_mb=57344"),
    ],
)
def test_apple_unified_memory_and_working_set(
    tmp_path: Path, mac: str, ram_gib: int, limit_bytes: int, rule: str
) -> None:
    inputs = replace(mac_inputs(tmp_path, mac), load_llama_cpp=_metal_build)
    machine = detect_machine(tmp_path, inputs)
    (gpu,) = machine.gpus
    assert gpu.vendor == "apple" and gpu.unified and gpu.source == "sysctl"
    assert gpu.name == recorded("sysctl_macos.json")[mac]["machdep.cpu.brand_string"]
    assert gpu.total_bytes == gpu.free_bytes == limit_bytes
    assert rule in gpu.note
    assert machine.cpu.model == gpu.name and "neon" in machine.cpu.features
    assert machine.build.backends == ("metal", "cpu") and machine.offload_backend == "metal"
    assert machine.hints == ()
    assert metal_working_set(ram_gib * GIB)[0] == (
        ram_gib * GIB * 2 // 3 if ram_gib <= 36 else ram_gib * GIB * 3 // 4
    )


@pytest.mark.parametrize(
    ("mac", "gbs"),
    [("m3_pro_36g", 150), ("m2_max_64g", 400), ("m4_max_128g", 546), ("m4_max_36g_binned", 410)],
)
def test_apple_chip_bandwidth_from_the_chip_name(tmp_path: Path, mac: str, gbs: float) -> None:
    (gpu,) = detect_machine(tmp_path, mac_inputs(tmp_path, mac)).gpus
    assert gpu.bandwidth_bytes_per_s == gbs * 1e9
    assert f"{gbs} GB/s" in gpu.note


def test_unknown_apple_chip_leaves_bandwidth_to_the_planner() -> None:
    gpu = apple_gpu(64 * GIB, "Apple M9 Hyper", None, "sysctl")
    assert gpu.bandwidth_bytes_per_s is None and "GB/s" not in gpu.note


def test_apple_with_a_cpu_only_build_gets_a_metal_hint(tmp_path: Path) -> None:
    machine = detect_machine(tmp_path, mac_inputs(tmp_path, "m2_max_64g"))  # the real (CPU) llama_cpp build
    assert machine.offload_backend == "cpu"
    assert any("no Metal" in h for h in machine.hints)


# CPU, disk, build --------------------------------------------------------------------------------------------


def test_cpuinfo_x86_flags() -> None:
    cpu, result = probe_cpu_linux(DATA / "cpuinfo_amd_epyc_x86_64.txt", "x86_64", lambda logical: 2)
    assert cpu.model == "AMD EPYC"
    assert cpu.features == ("avx2", "avx512f", "avx512_vnni", "f16c", "fma")
    assert result.ok and "avx512f" in result.detail


def test_cpuinfo_arm_reports_neon_and_sve() -> None:
    cpu, _ = probe_cpu_linux(DATA / "cpuinfo_neoverse_v1_aarch64.txt", "aarch64", lambda logical: 64)
    assert cpu.features == ("neon", "sve")
    assert cpu.model == "aarch64 CPU (implementer 0x41, part 0xd40)"
    assert cpu.physical_cores == cpu.logical_cores == 64


def test_disk_uses_the_nearest_existing_parent(tmp_path: Path) -> None:
    disk, result = probe_disk(tmp_path / "hf" / "hub" / "not-yet")
    assert disk.path == str(tmp_path) and disk.free_bytes > 0 and disk.total_bytes >= disk.free_bytes
    assert "nearest existing parent" in result.detail


def test_build_backends_parsed_from_system_info_when_no_registry() -> None:
    cuda_build = SimpleNamespace(
        __version__="0.3.36",
        llama_supports_gpu_offload=lambda: True,
        llama_print_system_info=lambda: (
            b"CUDA : ARCHS = 890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | AVX2 = 1 | "
        ),
    )
    build, result = probe_build(cuda_build)
    assert build.backends == ("cuda", "cpu") and build.gpu_offload
    assert "CUDA, CPU" in result.detail and "llama_print_system_info" in result.detail


def test_build_not_importable_is_soft() -> None:
    build, result = probe_build(None, "ImportError: libllama.so: cannot open shared object file")
    assert build.version is None and not build.gpu_offload and not result.ok
    assert "libllama.so" in result.detail


# Whole machine: hints and soft failure --------------------------------------------------------------------


def test_cuda_cards_with_the_real_cpu_only_build_get_the_rebuild_hint(tmp_path: Path) -> None:
    nvml = RecordedNvml(recorded("nvml_rtx4090_rtx3090.json")["devices"])
    machine = detect_machine(tmp_path, replace(no_gpu_inputs(tmp_path), load_nvml=lambda: nvml))
    assert len(machine.gpus) == 2
    assert machine.build.version == "0.3.36" and not machine.build.gpu_offload  # this machine's real build
    assert machine.offload_backend == "cpu"
    (hint,) = machine.hints
    assert (
        'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
        in hint
    )
    assert "RTX 4090" in hint and "RTX 3090" in hint


def test_amd_card_with_cpu_build_gets_the_hip_hint(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", "amd_rx7900xtx")
    machine = detect_machine(tmp_path, replace(no_gpu_inputs(tmp_path), sysfs_root=sysfs))
    (gpu,) = machine.gpus
    assert gpu.vendor == "amd"
    assert any('CMAKE_ARGS="-DGGML_HIP=on"' in h for h in machine.hints)


def test_nvidia_card_without_driver_is_reported(tmp_path: Path) -> None:
    sysfs = write_sysfs(tmp_path / "sys", "intel_igpu_plus_nvidia_without_driver")
    machine = detect_machine(tmp_path, replace(no_gpu_inputs(tmp_path), sysfs_root=sysfs))
    assert machine.gpus == ()  # the iGPU is not VRAM, the NVIDIA card is unreadable
    assert any("PCI 10de:2684" in h and "NVIDIA driver" in h for h in machine.hints)


def test_a_probe_that_raises_is_recorded_and_detection_goes_on(tmp_path: Path) -> None:
    def broken_virtual_memory() -> None:
        raise PermissionError("/proc/meminfo: permission denied")

    def broken_nvml() -> None:
        raise RuntimeError("NVML segfault guard")

    inputs = replace(no_gpu_inputs(tmp_path), virtual_memory=broken_virtual_memory, load_nvml=broken_nvml)
    machine = detect_machine(tmp_path, inputs)
    by_name = {p.name: p for p in machine.probes}
    assert not by_name["memory"].ok
    assert by_name["memory"].detail == "probe failed: PermissionError: /proc/meminfo: permission denied"
    assert not by_name["nvidia"].ok and "RuntimeError" in by_name["nvidia"].detail
    assert machine.memory.total_bytes == 0
    assert by_name["cpu"].ok and machine.cpu.logical_cores >= 1  # the others still ran
    assert by_name["llama.cpp"].ok and machine.build.version == "0.3.36"


def test_missing_llama_cpp_python_gets_an_install_hint(tmp_path: Path) -> None:
    inputs = replace(
        no_gpu_inputs(tmp_path),
        load_llama_cpp=lambda: (None, "ModuleNotFoundError: No module named 'llama_cpp'"),
    )
    machine = detect_machine(tmp_path, inputs)
    assert machine.build.version is None and machine.offload_backend == "cpu"
    (hint,) = machine.hints
    assert "pip install llama-cpp-python==0.3.36" in hint
    assert "No module named 'llama_cpp'" in {p.name: p for p in machine.probes}["llama.cpp"].detail
