"""``clover-local runtime`` end to end in subprocesses against the releases stand-in: install, list, remove;
a real SIGKILL mid-download and at every later step leaves no runtime visible and the next run resumes the
download; a release with no archive for this machine is built from its source with CMake."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers_runtimes import ARCH_CPP, ARG_CPP, publish, releases, script_runtime, tar_gz
from releases_server import ReleasesServer
from waiting import wait_until

from clover_local import settings
from clover_local.runtimes.assets import Target
from clover_local.runtimes.install import install
from clover_local.runtimes.installed import installed_runtimes

__all__ = ["releases"]

REPO_ROOT = Path(__file__).resolve().parent.parent
FAULT_CHILD = Path(__file__).resolve().parent / "runtime_fault_child.py"
CPU = Target("linux", "x64", ("cpu",))


def _env() -> dict[str, str]:
    """This environment, with this checkout first on the path (the child runs this checkout's code)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clover_local", *args],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_install_list_remove_from_the_command_line(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001", padding=300_000)))
    done = _cli("runtime", "install", "--backend", "cpu")
    assert done.returncode == 0, done.stderr
    root = settings.runtimes_dir() / "b9001"
    assert done.stdout.split() == ["b9001", "cpu", "archive", str((root / "llama-server").resolve())]
    assert "Installed llama.cpp b9001 (cpu, archive)" in done.stderr
    assert "verifying" in done.stderr or "downloading" in done.stderr  # progress on stderr

    listed = _cli("runtime", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    payload = json.loads(listed.stdout)
    assert [(r["tag"], r["backend"], r["origin"], r["path"]) for r in payload["installed"]] == [
        ("b9001", "cpu", "archive", str(root))
    ]
    assert payload["pinned"][0]["backend"] == "embedded" and payload["pinned"][0]["commit"]
    text = _cli("runtime", "list").stdout
    assert "b9001" in text and "pinned" in text

    again = _cli("runtime", "install", "b9001", "--backend", "cpu")
    assert again.returncode == 0 and "already installed" in again.stderr

    removed = _cli("runtime", "remove", "b9001")
    assert removed.returncode == 0 and "Removed llama.cpp b9001" in removed.stdout
    assert "No llama.cpp runtime installed" in _cli("runtime", "list").stdout


def test_errors_are_messages_not_tracebacks(releases: ReleasesServer) -> None:
    releases.stop()
    done = _cli("runtime", "install", "--backend", "cpu")
    assert done.returncode == 1
    assert done.stderr.startswith("error: Could not find the latest llama.cpp release")
    assert "unreachable" in done.stderr and "Traceback" not in done.stderr
    bad = _cli("runtime", "remove", "b1")
    assert bad.returncode == 1 and "not installed" in bad.stderr


def test_a_kill_mid_download_leaves_nothing_installed_and_the_next_run_resumes(
    releases: ReleasesServer,
) -> None:
    name = publish(releases, "b9001", tar_gz(script_runtime("b9001", padding=2_000_000)))
    held_at = 1_000_000
    releases.knobs("b9001", name).hold_at = held_at
    part = settings.runtimes_dir() / ".downloads" / "b9001" / (name + ".part")
    child = subprocess.Popen(
        [sys.executable, "-m", "clover_local", "runtime", "install", "b9001", "--backend", "cpu"],
        cwd=REPO_ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: releases.held_streams == 1 and part.is_file() and part.stat().st_size == held_at,
            "the child to hold the transfer at 1 MB",
        )
    finally:
        child.kill()
        child.wait()
    assert installed_runtimes() == ()
    releases.knobs("b9001", name).hold_at = None
    runtime = install("b9001", target=CPU)
    assert releases.downloads(name)[-1].range == f"bytes={held_at}-"
    assert installed_runtimes() == (runtime,)
    assert not part.exists()


@pytest.mark.parametrize("phase", ["unpacking", "sources", "rename"])
def test_a_kill_at_each_later_step_leaves_no_half_runtime(phase: str, releases: ReleasesServer) -> None:
    name = publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    done = subprocess.run(
        [sys.executable, str(FAULT_CHILD), phase, "runtime", "install", "b9001", "--backend", "cpu"],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr
    base = settings.runtimes_dir()
    assert installed_runtimes() == ()
    assert not (base / "b9001").exists()
    assert [p.name for p in base.glob(".partial-b9001-*")]  # what the kill left, hidden
    gets = len(releases.downloads(name))
    runtime = install("b9001", target=CPU)
    assert installed_runtimes() == (runtime,)
    assert not list(base.glob(".partial-*"))  # the leftovers were removed
    assert len(releases.downloads(name)) == gets  # the verified archive was not fetched again


def _source_tarball(into: Path, tag: str) -> Path:
    """A release's source as GitHub's tarball endpoint packs it (``<owner>-<repo>-<sha>/``): a small CMake project
    whose ``llama-server`` target prints a llama.cpp-style version, with the two files a runtime keeps."""
    top = into / "ggml-org-llama.cpp-abc1234"
    (top / "src").mkdir(parents=True)
    (top / "common").mkdir()
    (top / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(fake_llama C)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\nadd_executable(llama-server server.c)\n"
    )
    (top / "server.c").write_text(
        f'#include <stdio.h>\nint main(void) {{ printf("version: {tag[1:]} (abc1234)\\n"); return 0; }}\n'
    )
    (top / "src" / "llama-arch.cpp").write_text(ARCH_CPP)
    (top / "common" / "arg.cpp").write_text(ARG_CPP)
    tarball = into / "source.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        tf.add(top, arcname=top.name)
    return tarball


@pytest.mark.slow
def test_no_archive_for_this_machine_builds_the_source(releases: ReleasesServer, tmp_path: Path) -> None:
    if shutil.which("cmake") is None or shutil.which("cc") is None:
        pytest.skip("no cmake or C compiler here")
    releases.add_release("b9002")
    tarball = _source_tarball(tmp_path, "b9002")
    releases.set_tarball("b9002", tarball)  # no archive at all: only the source
    heard: list[str] = []
    runtime = install("b9002", backend="cpu", notify=heard.append, jobs=2, target=CPU)
    assert runtime.origin == "source" and runtime.backend == "cpu"
    assert any("building it from source" in m for m in heard)
    manifest = json.loads((runtime.root / "runtime.json").read_text())
    assert manifest["sha256"] == hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert manifest["asset"] is None and manifest["server"] == "llama-server"
    done = subprocess.run([str(runtime.server), "--version"], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "version: 9002 (abc1234)"
    assert runtime.arch_source.read_text() == ARCH_CPP and runtime.arg_source.read_text() == ARG_CPP
    assert not (settings.cache_dir() / "runtime-builds").exists() or not any(
        (settings.cache_dir() / "runtime-builds").iterdir()
    )
