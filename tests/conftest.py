"""Shared fixtures. Every test runs with its own user directories and Hugging Face cache (autouse), so
nothing touches the person's real config, data or models."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hub_server import HubServer

    from clover_local.detect.cpu_load import CpuSample
    from clover_local.detect.ram_read import RamRead
    from clover_local.engine.types import ChatEngine

REPO_ROOT = Path(__file__).resolve().parent.parent

# llama.cpp's CPU threads (OpenMP builds: llama-cpp-python's and the llama-server the tests build) wait for each
# other at every operation by spinning. Tests simulate 2-core machines, so a llama-server child runs 2 threads;
# beside one other busy program (CI's machine may still be busy) its spinning threads stall each other and the
# suite took over four times as long (test_agents_generic.py: 125 s against more than 580 s beside one busy core).
# Sleeping waits make the tests' speed follow the load without changing any result. Set before anything loads
# libgomp (it reads this once), and inherited by every child the tests start. Benchmarks do not use it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def ram_read_here() -> RamRead:
    """This machine's RAM read rate, measured once for the whole run by the real probe (``detect.ram_read``)."""
    import psutil

    from clover_local.detect.probe import detect_cpu
    from clover_local.detect.ram_read import machine_key, measure_ram_read

    cpu = detect_cpu()
    key = machine_key(cpu.model, cpu.logical_cores, psutil.virtual_memory().total)
    return measure_ram_read(cpu.physical_cores, key)


@pytest.fixture(autouse=True)
def isolated_dirs(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, ram_read_here: RamRead
) -> Iterator[Path]:
    """Point clover-local's config/data/cache dirs and the HF cache at a fresh temporary folder (with this
    machine's RAM read rate kept there, as after a person's first plan: measured once a run, not every test)."""
    from clover_local.detect.ram_read import keep_ram_read

    root = tmp_path_factory.mktemp("user")
    keep_ram_read(root / "data", ram_read_here)
    monkeypatch.setenv("CLOVER_CONFIG_DIR", str(root / "config"))
    monkeypatch.setenv("CLOVER_DATA_DIR", str(root / "data"))
    monkeypatch.setenv("CLOVER_CACHE_DIR", str(root / "cache"))
    monkeypatch.setenv("HF_HOME", str(root / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hf" / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("CLOVER_PRESET", raising=False)
    monkeypatch.delenv("CLOVER_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("CLOVER_RUNTIMES_DIR", raising=False)
    # No test asks GitHub what the latest llama.cpp release knows: a closed local port answers at once.
    monkeypatch.setenv("CLOVER_LLAMACPP_RELEASES", "http://127.0.0.1:9")
    monkeypatch.setenv("CLOVER_LLAMACPP_RAW", "http://127.0.0.1:9")
    _reload_hf_constants(monkeypatch)
    yield root


def _reload_hf_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub reads its environment once, at import: refresh the values tests depend on."""
    import os

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HOME", os.environ["HF_HOME"])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", os.environ["HF_HUB_CACHE"])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A fake Hugging Face Hub on 127.0.0.1 (``tests/hub_server.py``), with huggingface_hub pointed at it.

    huggingface_hub reads ``HF_ENDPOINT`` at import, so besides the variable this patches the constants it
    builds URLs from and the endpoint of its module-level ``HfApi`` (behind ``model_info``,
    ``list_repo_files``...). Add content with ``hub_server.add_file(repo, path, data_or_path)``; gated and
    private repos accept ``hub_server.token``.
    """
    from hub_server import HubServer
    from huggingface_hub import constants, hf_api

    server = HubServer().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_api.api, "endpoint", server.url)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF (assembled once into the test-models folder)."""
    from clover_local.testing.models import gemma_path as build

    return build()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2 135M Instruct Q4_1 GGUF (an instruct model with a ChatML template), from its package."""
    from clover_local.testing.models import smollm2_path as find

    return find()


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """Tiny random GGUFs by kind: ``llama``, ``qwen3moe``, ``qwen35moe`` (built once, F16)."""
    from clover_local.testing.models import TINY_KINDS, tiny_model

    return {kind: tiny_model(kind) for kind in TINY_KINDS}


@pytest.fixture(scope="session")
def gemma_engine(gemma_path: Path) -> Iterator[ChatEngine]:
    """The real Gemma 3 270M in the embedded engine, planned for this machine with a 1024-token context as the
    app loads it (one UI core left on small machines), loaded once per session."""
    from clover_local import user_prefs
    from clover_local.launch import open_launch
    from clover_local.presets import load_preset
    from clover_local.tui.services import launch_for

    preset = load_preset("gemma3-270m")
    settings = user_prefs.ModelSettings(ctx=1024)
    engine = open_launch(launch_for(preset, str(gemma_path), settings)).engine
    yield engine
    engine.close()


@pytest.fixture(params=["gemma", "instant", "slow"])
def any_speed_engine(request: pytest.FixtureRequest) -> ChatEngine:
    """For the tests that hold a reply still going (``GatedEngine``) or stop it: the real Gemma 3 270M, and a
    scripted engine that answers at once (a machine faster than any real one) or slowly (a loaded one). Each
    such test must pass at all three speeds: none may hope that the model is slow, or fast."""
    from helpers_engine import SLOW_TOKEN_S, ScriptedEngine

    if request.param == "gemma":
        engine: ChatEngine = request.getfixturevalue("gemma_engine")
        return engine
    return ScriptedEngine(delay_s=0.0 if request.param == "instant" else SLOW_TOKEN_S)


def _cpu_counters(others_busy: float) -> Callable[[], CpuSample]:
    """CPU counters in which the other programs keep ``others_busy`` cores busy, whatever the machine running
    the test is doing."""
    import time

    from clover_local.detect.cpu_load import CpuSample

    def sample() -> CpuSample:
        now = time.monotonic()
        return CpuSample(now, busy_s=others_busy * now, mine_s=0.0)

    return sample


@pytest.fixture
def quiet_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verification-cost probe sees no other program on the CPU: it keeps what it measures, however busy
    the machine running the tests is (``engine.verify_probe`` drops a table measured beside busy programs)."""
    monkeypatch.setattr("clover_local.engine.verify_probe.sample_cpu", _cpu_counters(0.0))


@pytest.fixture
def busy_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verification-cost probe sees other programs keeping every core of this machine busy."""
    import psutil

    cores = float(psutil.cpu_count(logical=True) or 1)
    monkeypatch.setattr("clover_local.engine.verify_probe.sample_cpu", _cpu_counters(cores))
