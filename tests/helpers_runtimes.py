"""Shared pieces of the runtime tests: the releases stand-in as a fixture, the source files a release serves, and
archives built the way upstream packs them (``llama-<tag>/`` at the top), real or hostile."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from releases_server import ReleasesServer

from clover_local import llama_arch_table, settings

RELEASES_DATA = Path(__file__).parent / "data" / "llamacpp_releases"
"""Asset lists of real llama.cpp releases, one file per release (its ``#`` lines say where it was read)."""


def assets_of(tag: str) -> list[str]:
    """The asset names of release ``tag`` as upstream published them (``tests/data/llamacpp_releases``)."""
    lines = (RELEASES_DATA / f"{tag}.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# Read before the autouse fixture points CLOVER_DATA_DIR at a temporary folder.
PINNED_BIN = settings.llama_server_dir()

SCRIPT_SERVER = b"#!/bin/sh\necho 'version: 9001 (0000000)'\necho 'built with a shell script for the tests'\n"
"""A stand-in ``llama-server`` for tests about packaging, digests and faults, where what the binary does is beside
the point (it answers ``--version`` as llama.cpp's does). The install test runs the real one."""

ARCH_CPP = """// src/llama-arch.cpp of a stand-in release
static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {
    { LLM_ARCH_LLAMA,      "llama"      },
    { LLM_ARCH_QWEN35MOE,  "qwen35moe"  },
    { LLM_ARCH_CLOVER_MOE, "clover_moe" },
    { LLM_ARCH_LLADA,      "llada"      },
    { LLM_ARCH_UNKNOWN,    "(unknown)"  },
};

bool llm_arch_is_diffusion(const llm_arch & arch) {
    switch (arch) {
        case LLM_ARCH_LLADA:
            return true;
        default:
            return false;
    }
}
"""


def arch_cpp(*extra: str) -> str:
    """A ``src/llama-arch.cpp`` naming the pinned llama.cpp's architectures and ``extra`` ones (the name table
    and the diffusion switch, as :func:`clover_local.arch_support.parse_llama_arch` reads them)."""
    names = (*llama_arch_table.ARCHITECTURES, *extra)
    rows = "".join(f'    {{ LLM_ARCH_N{i},  "{name}" }},\n' for i, name in enumerate(names))
    cases = "".join(
        f"        case LLM_ARCH_N{i}:\n" for i, n in enumerate(names) if n in llama_arch_table.DIFFUSION
    )
    return (
        "static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n"
        f'{rows}    {{ LLM_ARCH_UNKNOWN, "(unknown)" }},\n}};\n\n'
        "bool llm_arch_is_diffusion(const llm_arch & arch) {\n    switch (arch) {\n"
        f"{cases}            return true;\n        default:\n            return false;\n    }}\n}}\n"
    )


ARG_CPP = """// common/arg.cpp of a stand-in release
    add_opt(common_arg(
        {"-c", "--ctx-size"}, "N",
        "size of the prompt context",
        [](common_params & params, int value) { params.n_ctx = value; }
    ));
"""


@dataclass(frozen=True)
class Member:
    """One archive member: a file, a folder, a link, or something hostile."""

    name: str
    data: bytes = b""
    mode: int = 0o644
    kind: str = "file"
    """``file``, ``dir``, ``symlink``, ``hardlink``, ``fifo``, ``chardev``."""
    link: str = ""


def tar_gz(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.mode = m.mode
            if m.kind == "file":
                info.size = len(m.data)
                tf.addfile(info, io.BytesIO(m.data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chardev": tarfile.CHRTYPE,
            }[m.kind]
            info.linkname = m.link
            tf.addfile(info)
    return buf.getvalue()


def zip_bytes(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for m in members:
            info = zipfile.ZipInfo(m.name)
            if m.kind == "symlink":
                info.external_attr = 0o120777 << 16
                zf.writestr(info, m.link)
            else:
                info.external_attr = (0o100000 | m.mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, m.data)
    return buf.getvalue()


def script_runtime(tag: str, *, padding: int = 0) -> list[Member]:
    """A runtime archive as upstream packs it, with the shell-script ``llama-server`` (and ``padding`` bytes of
    a library, so a transfer can be held mid-way)."""
    top = f"llama-{tag}"
    members = [
        Member(f"{top}/", kind="dir", mode=0o755),
        Member(f"{top}/llama-server", SCRIPT_SERVER, 0o755),
        Member(f"{top}/LICENSE", b"MIT\n"),
    ]
    if padding:
        members.append(Member(f"{top}/libggml-base.so", os.urandom(padding), 0o755))
    return members


def publish(
    server: ReleasesServer,
    tag: str,
    archive: bytes | Path,
    *,
    name: str | None = None,
    latest: bool = True,
    sources: bool = True,
) -> str:
    """Serve ``archive`` as release ``tag``'s Linux x64 CPU archive (with its raw source files); the asset name."""
    name = name or f"llama-{tag}-bin-ubuntu-x64.tar.gz"
    server.add_release(tag, latest=latest)
    server.add_asset(tag, name, archive)
    if sources:
        server.add_raw(tag, "src/llama-arch.cpp", ARCH_CPP)
        server.add_raw(tag, "common/arg.cpp", ARG_CPP)
    return name


_OS_WORDS = {"linux": "ubuntu", "macos": "macos", "windows": "win"}
_VARIANTS = {
    "cpu": "",
    "metal": "",
    "vulkan": "vulkan-",
    "cuda-12": "cuda-12.4-",
    "cuda-13": "cuda-13.1-",
    "rocm": "rocm-7.2-",
}


def host_asset(tag: str) -> str:
    """The archive name upstream gives the build this machine's first backend picks (so the app, which asks
    this machine, chooses it: a CUDA machine gets a ``cuda-12.4`` name holding the pinned CPU build)."""
    from clover_local.runtimes.install import host_target

    aim = host_target()
    ext = "zip" if aim.os == "windows" else "tar.gz"
    return f"llama-{tag}-bin-{_OS_WORDS[aim.os]}-{_VARIANTS[aim.backends[0]]}{aim.arch}.{ext}"


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ReleasesServer]:
    """The stand-in, with CLOVER_LLAMACPP_RELEASES / CLOVER_LLAMACPP_RAW pointed at it and runtimes in a
    temporary folder."""
    server = ReleasesServer().start()
    monkeypatch.setenv("CLOVER_LLAMACPP_RELEASES", server.api_url)
    monkeypatch.setenv("CLOVER_LLAMACPP_RAW", server.raw_url)
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(tmp_path / "runtimes"))
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    monkeypatch.delenv("GH_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.stop()


def pinned_runtime_archive(into: Path, tag: str) -> Path:
    """The pinned build (``llama-server`` and any shared libraries beside it, with its kept sources) packed as
    upstream packs a Linux release: ``llama-<tag>/...`` in a .tar.gz."""
    from helpers_serve import llama_server_path

    binary = llama_server_path()  # skips (or fails in CI) without one
    folder = binary.parent
    archive = into / f"llama-{tag}-bin-ubuntu-x64.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(binary, arcname=f"llama-{tag}/llama-server")
        for lib in sorted(folder.glob("*.so*")):
            tf.add(lib, arcname=f"llama-{tag}/{lib.name}")
    return archive
