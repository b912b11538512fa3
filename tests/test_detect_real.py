"""Detection on this very machine, and ``clover-local detect`` through the real CLI entry point."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from clover_local.cli import main
from clover_local.detect import detect_machine


def test_detect_machine_for_real(tmp_path: Path) -> None:
    machine = detect_machine(tmp_path / "models")
    assert not machine.simulated
    assert machine.memory.total_bytes == psutil.virtual_memory().total
    assert 0 < machine.memory.available_bytes <= machine.memory.total_bytes
    assert machine.cpu.logical_cores == os.cpu_count()
    assert 1 <= machine.cpu.physical_cores <= machine.cpu.logical_cores
    assert machine.disk.path == str(tmp_path) and machine.disk.free_bytes > 0
    assert machine.build.version == "0.3.36"
    assert "cpu" in machine.build.backends
    assert "CPU :" in machine.build.system_info
    names = [p.name for p in machine.probes]
    assert names[:4] == ["cpu", "memory", "disk", "nvidia"]
    assert "llama.cpp" in names
    # whatever GPUs there are, each has its own numbers
    for gpu in machine.gpus:
        assert 0 < gpu.free_bytes <= gpu.total_bytes


def test_detect_json_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["detect", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory"]["total_bytes"] > 0
    assert data["cpu"]["logical_cores"] >= 1 and data["cpu"]["physical_cores"] >= 1
    assert data["build"]["version"] == "0.3.36"
    assert data["simulated"] is False
    assert data["offload_backend"] in ("cpu", "cuda", "metal", "vulkan", "rocm", "sycl")
    assert isinstance(data["gpus"], list) and {p["name"] for p in data["probes"]} >= {
        "cpu",
        "nvidia",
        "llama.cpp",
    }
    # disk is measured where the Hugging Face cache lives (the test's isolated HF_HUB_CACHE or its parent)
    assert os.environ["HF_HUB_CACHE"].startswith(data["disk"]["path"])


def test_detect_text_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["detect"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("This machine (")
    for label in ("CPU", "RAM", "Disk", "Build  llama-cpp-python 0.3.36", "Probes", "nvidia:"):
        assert label in out


def test_detect_simulate_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["detect", "--simulate", "ram=64G,gpu=nvidia:24G,gpu=nvidia:12G,backend=cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [g["total_bytes"] for g in data["gpus"]] == [24 * 1024**3, 12 * 1024**3]
    assert data["simulated"] is True and data["offload_backend"] == "cpu"
    assert any("-DGGML_CUDA=on" in h for h in data["hints"])

    assert main(["detect", "--simulate", "ram=64G,gpu=nvidia:24G,gpu=nvidia:12G"]) == 0
    lines = capsys.readouterr().out.splitlines()
    gpu_lines = [line for line in lines if line.startswith("  GPU ")]
    assert len(gpu_lines) == 2  # one line per GPU, never summed
    assert "24.0 GiB free / 24.0 GiB VRAM" in gpu_lines[0] and "12.0 GiB free / 12.0 GiB VRAM" in gpu_lines[1]


def test_bad_simulate_spec_is_a_usage_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["detect", "--simulate", "gpu=nvidia:lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --simulate: bad part 'gpu=nvidia:lots'")
    assert "Traceback" not in err
