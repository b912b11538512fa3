"""Which model architectures the llama.cpp here can load, which of them decode by diffusion, and the check that
refuses a GGUF whose ``general.architecture`` is not among them, before its bytes are downloaded or loaded.

Both tables come from llama.cpp's own ``src/llama-arch.cpp``: ``LLM_ARCH_NAMES`` (every architecture the loader
accepts) and ``llm_arch_is_diffusion`` (those ``llama_model_is_diffusion`` reports), read by
:func:`parse_llama_arch`:

- the embedded engine's (llama-cpp-python): generated into the package, :mod:`clover_local.llama_arch_table`
  (``scripts/gen_arch_table.py``, from the pinned llama-cpp-python sdist), so it is there on every install;
- a built llama-server's: the ``llama-arch.cpp`` that ``scripts/build-llama-server`` keeps beside the binaries,
  with ``build-info.json`` naming its version; it may be a newer llama.cpp than the embedded one.

:func:`check_architecture` decides; :func:`require_supported` turns a "no" into the one error people see.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from clover_local.errors import ArchitectureError

Runner = Literal["llama.cpp", "llama-server", "diffusion"]
"""What runs an architecture: ``llama.cpp`` (left to right, in the embedded engine or llama-server),
``llama-server`` (only the built llama-server's newer llama.cpp knows it), ``diffusion`` (denoising, in the
embedded engine's diffusion decoder)."""
Action = Literal["download", "load"]
"""What a refusal stops, for its message."""

_NAME_ROW = re.compile(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}")
_DIFFUSION_FN = re.compile(r"bool\s+llm_arch_is_diffusion\s*\([^)]*\)\s*\{(.*?)\n\}", re.DOTALL)
_CASE = re.compile(r"case\s+(LLM_ARCH_\w+)\s*:")
PACKAGED_SOURCE = "clover_local/llama_arch_table.py"


@dataclass(frozen=True)
class ArchTable:
    """What one llama.cpp can load."""

    names: frozenset[str]
    diffusion: frozenset[str]
    llama_cpp_python: str
    """The llama-cpp-python release whose vendored llama.cpp this is (``unknown`` when not recorded)."""
    llama_cpp_commit: str
    source: str
    """Where the table was read (a file), for messages."""

    @property
    def label(self) -> str:
        return f"llama-cpp-python {self.llama_cpp_python}, llama.cpp {self.llama_cpp_commit}"


@dataclass(frozen=True)
class ArchSupport:
    """The tables that apply here: the embedded engine's, and a built llama-server's when there is one."""

    embedded: ArchTable
    server: ArchTable | None = None
    installed: str | None = None
    """The llama-cpp-python version installed here; None when it is not installed."""


@dataclass(frozen=True)
class ArchCheck:
    """The answer for one GGUF: ``plan --json`` prints it as ``architecture``."""

    name: str | None
    """Its ``general.architecture``; None when the header could not be read."""
    supported: bool
    runner: Runner | None
    """What runs it (:data:`Runner`); None when nothing here can."""
    why: str


def parse_llama_arch(
    text: str,
    source: str = "llama-arch.cpp",
    llama_cpp_python: str = "unknown",
    llama_cpp_commit: str = "unknown",
) -> ArchTable:
    """The architecture names and the diffusion subset from the text of ``src/llama-arch.cpp``."""
    rows = dict(_NAME_ROW.findall(text))
    names = {name for enum, name in rows.items() if enum != "LLM_ARCH_UNKNOWN"}
    body = _DIFFUSION_FN.search(text)
    diffusion = {rows[e] for e in _CASE.findall(body.group(1)) if e in rows} if body else set()
    if not names:
        raise ValueError(f"{source}: no LLM_ARCH_NAMES table found")
    return ArchTable(frozenset(names), frozenset(diffusion), llama_cpp_python, llama_cpp_commit, source)


def packaged_table() -> ArchTable:
    """The pinned llama-cpp-python's table, generated into the package."""
    from clover_local import llama_arch_table as t

    return ArchTable(
        frozenset(t.ARCHITECTURES),
        frozenset(t.DIFFUSION),
        t.LLAMA_CPP_PYTHON,
        t.LLAMA_CPP_COMMIT,
        PACKAGED_SOURCE,
    )


def server_table(install_dir: Path | None = None) -> ArchTable | None:
    """The table of the llama.cpp ``scripts/build-llama-server`` built, from the ``llama-arch.cpp`` it keeps beside
    the binaries; None when none is there (llama-server not built) or it cannot be read."""
    from clover_local import settings

    folder = install_dir or settings.llama_server_dir()
    try:
        return _read_server_table(str(folder), (folder / "llama-arch.cpp").stat().st_mtime_ns)
    except (OSError, ValueError):
        return None


@lru_cache(maxsize=4)
def _read_server_table(folder: str, mtime_ns: int) -> ArchTable:
    path = Path(folder) / "llama-arch.cpp"
    try:
        info = json.loads((Path(folder) / "build-info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = {}
    info = info if isinstance(info, dict) else {}
    return parse_llama_arch(
        path.read_text(encoding="utf-8", errors="replace"),
        str(path),
        str(info.get("version", "unknown")),
        str(info.get("llama_cpp_commit", "unknown")),
    )


@lru_cache(maxsize=1)
def installed_llama_cpp_python() -> str | None:
    """The llama-cpp-python version installed here (read from its metadata: llama_cpp is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None


def installed_support(install_dir: Path | None = None) -> ArchSupport:
    """The tables that apply on this install. The embedded engine's is the packaged one, unless another
    llama-cpp-python is installed and llama-server was built from that same version (then its kept table)."""
    packaged = packaged_table()
    server = server_table(install_dir)
    installed = installed_llama_cpp_python()
    embedded = packaged
    if (
        server is not None
        and installed not in (None, packaged.llama_cpp_python)
        and server.llama_cpp_python == installed
    ):
        embedded = server
    return ArchSupport(embedded, server, installed)


def is_diffusion_arch(arch: str, support: ArchSupport | None = None) -> bool:
    """True for architectures llama.cpp runs as diffusion models (``llama_model_is_diffusion``)."""
    support = support or installed_support()
    return arch in support.embedded.diffusion


def check_architecture(arch: str, support: ArchSupport | None = None) -> ArchCheck:
    """Can the llama.cpp here load a GGUF whose ``general.architecture`` is ``arch``, and what runs it?

    The embedded engine's table decides first (diffusion models only decode there); an architecture only a
    newer built llama-server knows runs in llama-server."""
    support = support or installed_support()
    embedded, server = support.embedded, support.server
    if arch in embedded.names:
        if arch in embedded.diffusion:
            return ArchCheck(
                arch,
                True,
                "diffusion",
                f"{embedded.label} loads {arch!r}, a diffusion model: the diffusion engine runs it",
            )
        return ArchCheck(arch, True, "llama.cpp", f"{embedded.label} loads {arch!r}")
    if server is not None and arch in server.names and arch not in server.diffusion:
        return ArchCheck(
            arch,
            True,
            "llama-server",
            f"only the built llama-server ({server.label}) loads {arch!r}, not the embedded {embedded.label}: "
            "it runs in llama-server",
        )
    why = (
        f"the llama.cpp here cannot load the architecture {arch!r} ({embedded.label}: not among its "
        f"{len(embedded.names)} architectures"
    )
    if server is not None and server.label != embedded.label:
        known = (
            "a diffusion model, which llama-server cannot decode"
            if arch in server.names
            else "nor does it know it"
        )
        why += f"; the built llama-server, {server.label}: {known}"
    if support.installed not in (None, embedded.llama_cpp_python):
        why += f"; the table is llama-cpp-python {embedded.llama_cpp_python}'s, but {support.installed} is installed"
    return ArchCheck(arch, False, None, why + ")")


def unreadable(reason: str) -> ArchCheck:
    """The answer when the GGUF header could not be read: unchecked is not allowed."""
    return ArchCheck(
        None, False, None, f"its GGUF header could not be read ({reason}), so its architecture is unknown"
    )


def require_supported(check: ArchCheck, subject: str, action: Action, *, force: bool = False) -> ArchCheck:
    """``check`` when the architecture can be loaded (or ``force`` says to go on anyway); otherwise the one
    refusal people see: what the file is, the llama.cpp here, and the three ways on."""
    if check.supported or force:
        return check
    done, verb = ("downloaded", "download") if action == "download" else ("loaded", "try loading")
    if check.name is None:
        raise ArchitectureError(
            f"{subject}: {check.why}. Nothing was {done}.",
            f"Check that it is a GGUF made for llama.cpp, or add --force to {verb} it anyway.",
        )
    raise ArchitectureError(
        f"{subject}: {check.why}. Nothing was {done}.",
        f"Install a llama-cpp-python whose llama.cpp knows {check.name!r} (pip install -U llama-cpp-python), "
        "build llama-server from a newer one (scripts/build-llama-server --version <newer llama-cpp-python> "
        "--force), "
        f"or add --force to {verb} it anyway.",
    )


def sidecar_skipped(kind: str, filename: str, check: ArchCheck, action: Action) -> str:
    """The note for a drafter sidecar whose architecture cannot be loaded: it is left out, the model is not."""
    without = "downloads" if action == "download" else "runs"
    return f"The {kind} sidecar {filename} is skipped: {check.why}. The model {without} without it."
