"""The architecture tables and the check (pure): the packaged table is llama.cpp's own, generated from the pinned
source and compared with it whenever the source is at hand; the check's answers and its one refusal."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tomllib
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from clover_local import arch_support, llama_arch_table, settings
from clover_local.arch_support import (
    ArchSupport,
    check_architecture,
    installed_support,
    packaged_table,
    parse_llama_arch,
    require_supported,
    server_table,
)
from clover_local.errors import ArchitectureError, UsageError

ROOT = Path(__file__).resolve().parent.parent
KEPT_DIR = settings.llama_server_dir()
"""Where scripts/build-llama-server keeps ``llama-arch.cpp`` (scripts/test builds it): read before the autouse
fixture points the data dir at a temporary folder."""
SOURCE_CANDIDATES = (
    KEPT_DIR / "llama-arch.cpp",
    Path(
        f"/tmp/sdist/llama_cpp_python-{llama_arch_table.LLAMA_CPP_PYTHON}/vendor/llama.cpp/src/llama-arch.cpp"
    ),
)

ARCH_SNIPPET = """
static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA,            "llama"            },
    { LLM_ARCH_DREAM,            "dream"            },
    { LLM_ARCH_LLADA_MOE,        "llada-moe"        },
    { LLM_ARCH_UNKNOWN,          "(unknown)"        },
};

bool llm_arch_is_diffusion(const llm_arch & arch) {
    switch (arch) {
        case LLM_ARCH_DREAM:
        case LLM_ARCH_LLADA_MOE:
            return true;
        default:
            return false;
    }
}
"""


def _gen_script() -> ModuleType:
    """``scripts/gen_arch_table.py`` as a module (its ``render`` writes the packaged table)."""
    path = ROOT / "scripts" / "gen_arch_table.py"
    spec = importlib.util.spec_from_file_location("gen_arch_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pinned_source() -> tuple[Path, str]:
    """The pinned llama.cpp's ``llama-arch.cpp`` and where it came from; skips (fails in CI) without one."""
    info = KEPT_DIR / "build-info.json"
    kept_version = json.loads(info.read_text())["version"] if info.is_file() else None
    for path in SOURCE_CANDIDATES:
        if not path.is_file():
            continue
        if path.parent == KEPT_DIR and kept_version != llama_arch_table.LLAMA_CPP_PYTHON:
            continue  # llama-server was built from another llama.cpp: not the pinned table
        return path, str(path)
    if os.environ.get("CI"):
        pytest.fail("the pinned llama-arch.cpp is not at hand: scripts/build-llama-server keeps it")
    pytest.skip("the pinned llama.cpp source is not at hand (run scripts/build-llama-server)")


def test_parse_llama_arch_reads_names_and_the_diffusion_set() -> None:
    table = parse_llama_arch(ARCH_SNIPPET)
    assert table.names == {"llama", "dream", "llada-moe"}
    assert table.diffusion == {"dream", "llada-moe"}
    with pytest.raises(ValueError, match="no LLM_ARCH_NAMES"):
        parse_llama_arch("int main() {}")


def test_the_packaged_table_is_the_pinned_sources() -> None:
    path, where = _pinned_source()
    source = parse_llama_arch(path.read_text(encoding="utf-8"), where)
    packaged = packaged_table()
    assert packaged.names == source.names, (
        f"stale table: run scripts/gen_arch_table.py (only in the package: {sorted(packaged.names - source.names)},"
        f" only in {where}: {sorted(source.names - packaged.names)})"
    )
    assert packaged.diffusion == source.diffusion == {"dream", "llada", "llada-moe", "rnd1"}
    assert {"qwen35moe", "llama", "gemma3"} <= packaged.names


def test_the_packaged_table_is_for_the_pinned_llama_cpp_python() -> None:
    """Changing the pin without regenerating the table fails here, with or without the source."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [r for r in project["dependencies"] if r.startswith("llama-cpp-python==")]
    assert pins == [f"llama-cpp-python=={llama_arch_table.LLAMA_CPP_PYTHON}"]
    assert re.fullmatch(r"[0-9a-f]{9}", llama_arch_table.LLAMA_CPP_COMMIT)


def test_the_packaged_module_is_what_the_generator_writes() -> None:
    """Nobody edited it by hand: rendering its own table gives the file back, byte for byte."""
    module_path = ROOT / "clover_local" / "llama_arch_table.py"
    assert _gen_script().render(packaged_table()) == module_path.read_text(encoding="utf-8")


def test_every_install_has_a_table_without_llama_server() -> None:
    assert not (settings.llama_server_dir() / "llama-arch.cpp").exists()  # this test's fresh data dir
    support = installed_support()
    assert support.server is None and support.embedded == packaged_table()
    assert check_architecture("qwen35moe").supported


def test_known_diffusion_and_unknown_architectures() -> None:
    support = ArchSupport(packaged_table())
    llama = check_architecture("qwen35moe", support)
    assert (llama.supported, llama.runner) == (True, "llama.cpp")
    dream = check_architecture("llada-moe", support)
    assert (dream.supported, dream.runner) == (True, "diffusion") and "diffusion" in dream.why
    clover = check_architecture("clover", support)
    assert (clover.supported, clover.runner) == (False, None)
    assert "'clover'" in clover.why and llama_arch_table.LLAMA_CPP_COMMIT in clover.why


def test_a_newer_llama_server_runs_what_only_it_knows(tmp_path: Path) -> None:
    newer = ARCH_SNIPPET.replace(
        "{ LLM_ARCH_UNKNOWN,", '{ LLM_ARCH_CLOVER,           "clover"           },\n    { LLM_ARCH_UNKNOWN,'
    )
    (tmp_path / "llama-arch.cpp").write_text(newer)
    (tmp_path / "build-info.json").write_text(
        json.dumps({"version": "9.9.9", "llama_cpp_commit": "abcdef123"})
    )
    server = server_table(tmp_path)
    assert server is not None and server.llama_cpp_python == "9.9.9" and "clover" in server.names
    support = ArchSupport(packaged_table(), server, llama_arch_table.LLAMA_CPP_PYTHON)
    check = check_architecture("clover", support)
    assert (check.supported, check.runner) == (True, "llama-server")
    assert "llama.cpp abcdef123" in check.why

    # A diffusion architecture only the server knows cannot run: llama-server does not decode diffusion.
    server = replace(server, diffusion=frozenset({"clover"}))
    check = check_architecture("clover", ArchSupport(packaged_table(), server))
    assert not check.supported and "llama-server cannot decode" in check.why


def test_the_kept_table_is_the_embedded_one_when_llama_cpp_python_matches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After `pip install -U llama-cpp-python` and building llama-server from that same version, the kept
    table describes the embedded engine too; with only the upgrade, the refusal says the table is older."""
    (tmp_path / "llama-arch.cpp").write_text(ARCH_SNIPPET)
    (tmp_path / "build-info.json").write_text(
        json.dumps({"version": "9.9.9", "llama_cpp_commit": "abcdef123"})
    )
    monkeypatch.setattr(arch_support, "installed_llama_cpp_python", lambda: "9.9.9")
    assert installed_support(tmp_path).embedded.llama_cpp_python == "9.9.9"
    monkeypatch.setattr(arch_support, "installed_llama_cpp_python", lambda: "9.9.8")
    support = installed_support(tmp_path)
    assert support.embedded == packaged_table()
    assert "but 9.9.8 is installed" in check_architecture("clover", support).why


def test_the_refusal_names_the_architecture_the_versions_and_the_ways_on() -> None:
    check = check_architecture("clover", ArchSupport(packaged_table()))
    with pytest.raises(ArchitectureError) as err:
        require_supported(check, "acme/Clover-GGUF Q4_K_M", "download")
    assert isinstance(err.value, UsageError) and err.value.exit_code == 2
    what, fix = err.value.what, err.value.fix or ""
    assert what.startswith("acme/Clover-GGUF Q4_K_M: ") and "'clover'" in what
    assert f"llama-cpp-python {llama_arch_table.LLAMA_CPP_PYTHON}" in what
    assert f"llama.cpp {llama_arch_table.LLAMA_CPP_COMMIT}" in what and "Nothing was downloaded" in what
    # No dead ends (no newer llama-cpp-python exists): the runtime installer, and --force.
    assert "pip install" not in fix and "clover-local runtime install <tag>" in fix
    assert "--force to download it anyway" in fix
    with pytest.raises(ArchitectureError, match="Nothing was loaded"):
        require_supported(check, "/models/x.gguf", "load")
    assert require_supported(check, "x", "download", force=True) is check


def test_an_architecture_only_llama_server_knows_runs_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clover_local.detect import parse_simulate
    from clover_local.errors import ServerError
    from clover_local.launch import LaunchRequest, choose_runner, decide_launch

    launch = decide_launch(
        LaunchRequest("gemma3-270m", describe=False), machine=parse_simulate("ram=16G,cpu=4")
    )
    assert launch.plan.architecture is not None and launch.plan.architecture.runner == "llama.cpp"
    assert launch.runner.kind == "embedded"

    only_server = replace(
        launch.plan.architecture, name="clover", runner="llama-server", why="only llama-server knows it"
    )
    with pytest.raises(ServerError, match="no llama-server was found"):
        choose_runner(LaunchRequest(), only_server, find_binary=lambda _configured: None)
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("CLOVER_LLAMA_SERVER", str(binary))
    choice = choose_runner(LaunchRequest(), only_server)
    assert (
        choice.kind == "llama-server" and choice.binary is not None and choice.binary.path == binary.resolve()
    )
    assert "only the built llama-server loads the architecture 'clover'" in choice.why
