"""The archive a runtime install picks, from the asset lists upstream really published
(``tests/data/llamacpp_releases/``, each with its source): before and after the CUDA 13.3 -> 13.4 rename, the
``hip-radeon`` -> ``rocm-<version>`` rename, Linux CUDA with its build-numbered runtime archives, Windows arm64.
First the pure choice (a table of targets per release), then ``install`` itself through the releases stand-in,
serving every asset of a real release, for each OS and backend: the archive and runtime it downloads."""

from __future__ import annotations

import json

import pytest
from helpers_runtimes import (
    ARCH_CPP,
    ARG_CPP,
    RELEASES_DATA,
    Member,
    assets_of,
    releases,
    script_runtime,
    tar_gz,
    zip_bytes,
)
from releases_server import ReleasesServer

from clover_local import settings
from clover_local.runtimes.assets import Target, choose_archive
from clover_local.runtimes.install import install

__all__ = ["releases"]  # the fixture

LINUX_X64, LINUX_ARM64 = ("linux", "x64"), ("linux", "arm64")
WIN_X64, WIN_ARM64 = ("windows", "x64"), ("windows", "arm64")
NVIDIA_13 = ("cuda-13", "cuda-12", "vulkan")  # a driver that runs CUDA 13 (target_for's order)
NVIDIA_12 = ("cuda-12", "vulkan")

# (release, (os, arch), backends best first) -> (archive, CUDA runtime archive or None); None: no archive fits.
PICKS: list[tuple[str, tuple[str, str], tuple[str, ...], tuple[str, str | None] | None]] = [
    # b11459, the newest: CUDA 13.4 on Linux and Windows, each with its own runtime archive
    ("b11459", LINUX_X64, ("cpu",), ("llama-b11459-bin-ubuntu-x64.tar.gz", None)),
    ("b11459", LINUX_ARM64, ("cpu",), ("llama-b11459-bin-ubuntu-arm64.tar.gz", None)),
    ("b11459", ("linux", "s390x"), ("cpu",), ("llama-b11459-bin-ubuntu-s390x.tar.gz", None)),
    ("b11459", LINUX_X64, NVIDIA_13, (
        "llama-b11459-bin-ubuntu-cuda-13.4-x64.tar.gz", "cudart-llama-b11459-bin-ubuntu-cuda-13.4-x64.tar.gz")),
    ("b11459", LINUX_X64, NVIDIA_12, (
        "llama-b11459-bin-ubuntu-cuda-12.8-x64.tar.gz", "cudart-llama-b11459-bin-ubuntu-cuda-12.8-x64.tar.gz")),
    ("b11459", LINUX_ARM64, NVIDIA_13, (
        "llama-b11459-bin-ubuntu-cuda-13.4-arm64.tar.gz", "cudart-llama-b11459-bin-ubuntu-cuda-13.4-arm64.tar.gz")),
    ("b11459", LINUX_ARM64, NVIDIA_12, ("llama-b11459-bin-ubuntu-vulkan-arm64.tar.gz", None)),  # no CUDA 12 arm64
    ("b11459", LINUX_X64, ("rocm", "vulkan"), ("llama-b11459-bin-ubuntu-rocm-10.0-x64.tar.gz", None)),
    ("b11459", LINUX_X64, ("vulkan",), ("llama-b11459-bin-ubuntu-vulkan-x64.tar.gz", None)),
    ("b11459", WIN_X64, NVIDIA_13, (
        "llama-b11459-bin-win-cuda-13.4-x64.zip", "cudart-llama-bin-win-cuda-13.4-x64.zip")),
    ("b11459", WIN_X64, NVIDIA_12, ("llama-b11459-bin-win-cuda-12.4-x64.zip", "cudart-llama-bin-win-cuda-12.4-x64.zip")),
    ("b11459", WIN_ARM64, NVIDIA_13, (
        "llama-b11459-bin-win-cuda-13.4-arm64.zip", "cudart-llama-bin-win-cuda-13.4-arm64.zip")),
    ("b11459", WIN_X64, ("rocm", "vulkan"), ("llama-b11459-bin-win-rocm-10.0-x64.zip", None)),
    ("b11459", WIN_ARM64, ("vulkan",), ("llama-b11459-bin-win-vulkan-arm64.zip", None)),
    ("b11459", WIN_X64, ("cpu",), ("llama-b11459-bin-win-cpu-x64.zip", None)),
    ("b11459", WIN_ARM64, ("cpu",), ("llama-b11459-bin-win-cpu-arm64.zip", None)),
    ("b11459", ("macos", "arm64"), ("metal",), ("llama-b11459-bin-macos-arm64.tar.gz", None)),
    ("b11459", ("macos", "x64"), ("cpu",), ("llama-b11459-bin-macos-x64.tar.gz", None)),
    ("b11459", LINUX_X64, ("sycl",), None),  # not a backend chosen here (nor snapdragon, openvino)
    # b10970: Linux CUDA 13.3, before the rename, runtime archives named with the build
    ("b10970", LINUX_X64, NVIDIA_13, (
        "llama-b10970-bin-ubuntu-cuda-13.3-x64.tar.gz", "cudart-llama-b10970-bin-ubuntu-cuda-13.3-x64.tar.gz")),
    ("b10970", LINUX_X64, NVIDIA_12, (
        "llama-b10970-bin-ubuntu-cuda-12.8-x64.tar.gz", "cudart-llama-b10970-bin-ubuntu-cuda-12.8-x64.tar.gz")),
    ("b10970", LINUX_ARM64, NVIDIA_13, (
        "llama-b10970-bin-ubuntu-cuda-13.3-arm64.tar.gz", "cudart-llama-b10970-bin-ubuntu-cuda-13.3-arm64.tar.gz")),
    ("b10970", WIN_X64, NVIDIA_13, ("llama-b10970-bin-win-cuda-13.3-x64.zip", "cudart-llama-bin-win-cuda-13.3-x64.zip")),
    ("b10970", WIN_ARM64, NVIDIA_13, (
        "llama-b10970-bin-win-cuda-13.4-arm64.zip", "cudart-llama-bin-win-cuda-13.4-arm64.zip")),
    # the Windows CUDA 13 rename, either side of it: the same rule follows it
    ("b10840", WIN_X64, NVIDIA_13, ("llama-b10840-bin-win-cuda-13.3-x64.zip", "cudart-llama-bin-win-cuda-13.3-x64.zip")),
    ("b11069", WIN_X64, NVIDIA_13, ("llama-b11069-bin-win-cuda-13.4-x64.zip", "cudart-llama-bin-win-cuda-13.4-x64.zip")),
    # b10144: no Linux CUDA yet (an NVIDIA machine on Linux gets Vulkan), ROCm 7.2, hip-radeon on Windows
    ("b10144", LINUX_X64, NVIDIA_13, ("llama-b10144-bin-ubuntu-vulkan-x64.tar.gz", None)),
    ("b10144", LINUX_X64, ("rocm", "vulkan"), ("llama-b10144-bin-ubuntu-rocm-7.2-x64.tar.gz", None)),
    ("b10144", WIN_X64, ("rocm", "vulkan"), ("llama-b10144-bin-win-hip-radeon-x64.zip", None)),
    ("b10144", WIN_X64, NVIDIA_13, ("llama-b10144-bin-win-cuda-13.3-x64.zip", "cudart-llama-bin-win-cuda-13.3-x64.zip")),
    ("b10144", WIN_X64, NVIDIA_12, ("llama-b10144-bin-win-cuda-12.4-x64.zip", "cudart-llama-bin-win-cuda-12.4-x64.zip")),
    ("b10144", LINUX_X64, ("cpu",), ("llama-b10144-bin-ubuntu-x64.tar.gz", None)),  # not sycl, openvino
    # b7902: the older naming
    ("b7902", WIN_X64, NVIDIA_13, ("llama-b7902-bin-win-cuda-13.1-x64.zip", "cudart-llama-bin-win-cuda-13.1-x64.zip")),
    ("b7902", WIN_X64, ("rocm",), ("llama-b7902-bin-win-hip-radeon-x64.zip", None)),
    ("b7902", LINUX_X64, NVIDIA_12, ("llama-b7902-bin-ubuntu-vulkan-x64.tar.gz", None)),
    ("b7902", LINUX_ARM64, ("cpu",), None),  # no Linux arm64 build then: built from source
]  # fmt: skip


@pytest.mark.parametrize(("tag", "where", "backends", "expected"), PICKS)
def test_the_archive_each_real_release_offers_each_target(
    tag: str, where: tuple[str, str], backends: tuple[str, ...], expected: tuple[str, str | None] | None
) -> None:
    names = assets_of(tag)
    choice = choose_archive(names, tag, Target(where[0], where[1], backends))  # type: ignore[arg-type]
    if expected is None:
        assert choice is None
        return
    assert choice is not None
    asset, runtime = expected
    assert (choice.asset, choice.extras) == (asset, (runtime,) if runtime else ())
    assert asset in names and (runtime is None or runtime in names)  # upstream's names, not made up here


def test_every_release_file_is_upstreams_shape() -> None:
    for path in sorted(RELEASES_DATA.glob("b*.txt")):
        names = assets_of(path.stem)
        assert names and path.read_text().startswith("# llama.cpp release " + path.stem)
        assert all(n.startswith(("llama-", "cudart-llama-")) for n in names), path.name


def _archive(name: str) -> bytes:
    """A small archive packed as upstream packs it (its name in the LICENSE, to tell them apart): the binaries,
    or a CUDA runtime's libraries (no llama-server)."""
    if name.startswith("cudart-"):
        members = [Member(f"{name.split('.')[0]}/libcudart.so", b"cuda runtime " + name.encode(), 0o755)]
    else:
        tag = name.split("-")[1]
        members = [*script_runtime(tag)[:2], Member(f"llama-{tag}/LICENSE", name.encode())]
        if "-win-" in name:  # Windows builds name it llama-server.exe (a script here, it runs on this host)
            members = [
                Member(m.name + ".exe", m.data, m.mode) if m.name.endswith("/llama-server") else m
                for m in members
            ]
    return zip_bytes(members) if name.endswith(".zip") else tar_gz(members)


def _serve_release(server: ReleasesServer, tag: str) -> None:
    server.add_release(tag, latest=True)
    for name in assets_of(tag):
        server.add_asset(tag, name, _archive(name))
    server.add_raw(tag, "src/llama-arch.cpp", ARCH_CPP)
    server.add_raw(tag, "common/arg.cpp", ARG_CPP)


INSTALLS = [
    ("b11459", LINUX_X64, NVIDIA_13),
    ("b11459", WIN_X64, ("rocm", "vulkan")),
    ("b11459", WIN_ARM64, NVIDIA_13),
    ("b11459", ("macos", "arm64"), ("metal",)),
    ("b10970", LINUX_X64, NVIDIA_12),
    ("b10144", WIN_X64, ("rocm", "vulkan")),
    ("b10144", LINUX_X64, NVIDIA_13),
    ("b7902", WIN_X64, NVIDIA_13),
]


@pytest.mark.parametrize(("tag", "where", "backends"), INSTALLS)
def test_install_downloads_the_archive_and_runtime_a_real_release_offers(
    releases: ReleasesServer, tag: str, where: tuple[str, str], backends: tuple[str, ...]
) -> None:
    _serve_release(releases, tag)
    expected = next(e for t, w, b, e in PICKS if (t, w, b) == (tag, where, backends))
    assert expected is not None
    asset, runtime = expected
    installed = install(tag, target=Target(where[0], where[1], backends))  # type: ignore[arg-type]
    manifest = json.loads((settings.runtimes_dir() / tag / "runtime.json").read_text())
    assert manifest["asset"] == asset and installed.backend == manifest["backend"]
    assert [a["name"] for a in manifest["assets"]] == [asset, *([runtime] if runtime else [])]
    assert all(a["verified"] for a in manifest["assets"])  # each checked against the digest GitHub publishes
    fetched = {name for name in assets_of(tag) if releases.downloads(name)}
    assert fetched == {asset, *([runtime] if runtime else [])}  # nothing else of the release was downloaded
    assert installed.server.name in ("llama-server", "llama-server.exe")
    assert asset in (installed.server.parent / "LICENSE").read_text()
    if runtime:
        assert list((settings.runtimes_dir() / tag).rglob("libcudart.so"))  # unpacked beside the binaries
