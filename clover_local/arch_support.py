"""Which model architectures the installed llama.cpp can load, and which of them decode by diffusion.

Read from ``llama-arch.cpp``, the source file that ``scripts/build-llama-server`` keeps beside the binaries
(llama-cpp-python 0.3.36 and that build come from the same pinned llama.cpp): the ``LLM_ARCH_NAMES`` table
(every ``general.architecture`` the loader accepts) and ``llm_arch_is_diffusion`` (the architectures that
``llama_model_is_diffusion`` reports). :func:`preflight` checks a GGUF header's architecture against them
before anything is downloaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from clover_local.errors import UsageError

Decoding = Literal["autoregressive", "diffusion"]

_NAME_ROW = re.compile(r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}")
_DIFFUSION_FN = re.compile(r"bool\s+llm_arch_is_diffusion\s*\([^)]*\)\s*\{(.*?)\n\}", re.DOTALL)
_CASE = re.compile(r"case\s+(LLM_ARCH_\w+)\s*:")

KNOWN_DIFFUSION = frozenset({"dream", "llada", "llada-moe", "rnd1"})
"""The diffusion architectures of the pinned llama.cpp, for when its ``llama-arch.cpp`` is not at hand."""


@dataclass(frozen=True)
class ArchSupport:
    """What one llama.cpp build can load."""

    names: frozenset[str]
    diffusion: frozenset[str]
    source: str
    """Where this came from (a file path), for messages."""

    def decoding(self, arch: str) -> Decoding:
        return "diffusion" if arch in self.diffusion else "autoregressive"


def parse_llama_arch(text: str, source: str = "llama-arch.cpp") -> ArchSupport:
    """The architecture names and the diffusion subset from the text of ``src/llama-arch.cpp``."""
    rows = dict(_NAME_ROW.findall(text))
    names = {name for enum, name in rows.items() if enum != "LLM_ARCH_UNKNOWN"}
    body = _DIFFUSION_FN.search(text)
    diffusion = {rows[e] for e in _CASE.findall(body.group(1)) if e in rows} if body else set()
    if not names:
        raise ValueError(f"{source}: no LLM_ARCH_NAMES table found")
    return ArchSupport(frozenset(names), frozenset(diffusion), source)


def arch_source_path() -> Path:
    from clover_local import settings

    return settings.llama_server_dir() / "llama-arch.cpp"


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> ArchSupport:
    return parse_llama_arch(Path(path).read_text(encoding="utf-8", errors="replace"), path)


def installed_support(path: Path | None = None) -> ArchSupport | None:
    """The installed build's support table, or None when its ``llama-arch.cpp`` is not there."""
    path = path or arch_source_path()
    try:
        return _load(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError):
        return None


def is_diffusion_arch(arch: str, support: ArchSupport | None = None) -> bool:
    """True for architectures llama.cpp runs as diffusion models (``llama_model_is_diffusion``)."""
    support = support if support is not None else installed_support()
    return arch in (support.diffusion if support is not None else KNOWN_DIFFUSION)


@dataclass(frozen=True)
class Preflight:
    arch: str
    decoding: Decoding
    checked: bool
    """False when no support table was available: the architecture could not be checked."""
    note: str


def preflight(arch: str, what: str, support: ArchSupport | None = None) -> Preflight:
    """Check ``arch`` (a header's ``general.architecture``) before downloading ``what``.

    Raises :class:`UsageError` when the installed llama.cpp cannot load it, saying what to do."""
    support = support if support is not None else installed_support()
    if support is None:
        decoding: Decoding = "diffusion" if arch in KNOWN_DIFFUSION else "autoregressive"
        return Preflight(
            arch,
            decoding,
            False,
            f"Architecture {arch!r} not checked: the llama.cpp architecture list (llama-arch.cpp) is not "
            "installed (run scripts/build-llama-server).",
        )
    if arch not in support.names:
        raise UsageError(
            f"{what} uses the model architecture {arch!r}, which the installed llama.cpp cannot load "
            f"(it knows {len(support.names)} architectures; list: {support.source}).",
            "Nothing was downloaded. Install a newer llama-cpp-python (pip install -U llama-cpp-python) and "
            "rebuild llama-server from a llama.cpp that supports it (scripts/build-llama-server --force), "
            "then try again.",
        )
    decoding = support.decoding(arch)
    how = "block diffusion (llama_model_is_diffusion)" if decoding == "diffusion" else "autoregressive"
    return Preflight(arch, decoding, True, f"Architecture {arch!r}: the installed llama.cpp loads it; {how}.")
