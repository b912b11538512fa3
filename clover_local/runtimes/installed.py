"""What upstream llama.cpp runtimes are installed, read from their folders.

One folder per release tag under :func:`clover_local.settings.runtimes_dir`::

    runtimes/<tag>/runtime.json    the manifest (below); a folder without a readable one is not a runtime
    runtimes/<tag>/llama-arch.cpp  that tag's src/llama-arch.cpp: what this runtime can load
    runtimes/<tag>/arg.cpp         that tag's common/arg.cpp: the flags its llama-server takes
    runtimes/<tag>/...             the archive's files, or a source build's install; ``server`` names the binary

An install is written into a sibling ``.partial-<tag>-*`` folder and renamed into place, so a folder with a
manifest is always complete. ``runtime.json``::

    {"tag": "b12060", "backend": "cpu", "origin": "archive" | "source", "server": "bin/llama-server",
     "asset": "llama-b12060-bin-ubuntu-x64.tar.gz", "sha256": "<hex>", "installed": "<ISO time>"}
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clover_local import settings

Origin = Literal["archive", "source"]
MANIFEST = "runtime.json"
ARCH_SOURCE = "llama-arch.cpp"
ARG_SOURCE = "arg.cpp"
_TAG = re.compile(r"^b(\d{1,7})$")


def tag_number(tag: str) -> int | None:
    """The build number of a llama.cpp release tag (``b12060`` -> 12060); None for other names."""
    match = _TAG.match(tag)
    return int(match.group(1)) if match else None


def valid_tag(tag: str) -> bool:
    """A release tag safe to use as a folder name: llama.cpp's own ``b<digits>`` form."""
    return tag_number(tag) is not None


@dataclass(frozen=True)
class InstalledRuntime:
    """One installed upstream llama.cpp."""

    tag: str
    root: Path
    server: Path
    """The ``llama-server`` binary (absolute)."""
    backend: str
    """``cpu``, ``cuda-12``, ``cuda-13``, ``vulkan``, ``metal``, ``rocm``..."""
    origin: Origin
    asset: str | None
    sha256: str | None
    installed: str

    @property
    def arch_source(self) -> Path:
        """This runtime's ``llama-arch.cpp``: the architectures it loads."""
        return self.root / ARCH_SOURCE

    @property
    def arg_source(self) -> Path:
        """This runtime's ``common/arg.cpp``: the flags its llama-server takes (kept beside ``llama-arch.cpp``)."""
        return self.root / ARG_SOURCE

    @property
    def number(self) -> int:
        return tag_number(self.tag) or 0

    @property
    def label(self) -> str:
        return f"llama.cpp {self.tag} ({self.backend}, {self.origin})"


def read_runtime(root: Path) -> InstalledRuntime | None:
    """The runtime in ``root``; None when it is not a complete, runnable install."""
    raw = read_json_dict(root / MANIFEST)
    if raw is None:
        return None
    tag, server, origin = raw.get("tag"), raw.get("server"), raw.get("origin")
    if not (isinstance(tag, str) and valid_tag(tag) and tag == root.name and isinstance(server, str)):
        return None
    binary = (root / server).resolve()
    if root.resolve() not in binary.parents or not (binary.is_file() and os.access(binary, os.X_OK)):
        return None
    if not (root / ARCH_SOURCE).is_file():
        return None
    return InstalledRuntime(
        tag=tag,
        root=root,
        server=binary,
        backend=str(raw.get("backend") or "cpu"),
        origin="source" if origin == "source" else "archive",
        asset=raw.get("asset") if isinstance(raw.get("asset"), str) else None,
        sha256=raw.get("sha256") if isinstance(raw.get("sha256"), str) else None,
        installed=str(raw.get("installed") or ""),
    )


def installed_runtimes(folder: Path | None = None) -> tuple[InstalledRuntime, ...]:
    """Every complete runtime installed, newest release first. Partial installs (``.partial-*``) and folders
    that are not runtimes are skipped."""
    base = folder or settings.runtimes_dir()
    try:
        entries = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return ()
    found = [rt for rt in (read_runtime(p) for p in entries) if rt is not None]
    return tuple(sorted(found, key=lambda rt: rt.number, reverse=True))


def write_manifest(root: Path, runtime: dict[str, object]) -> None:
    """Write ``runtime.json`` (the last step of an install, inside the partial folder)."""
    (root / MANIFEST).write_text(json.dumps(runtime, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class PinnedRuntime:
    """The llama.cpp this package pins: the embedded engine's (llama-cpp-python), or the ``llama-server``
    ``scripts/build-llama-server`` built from the same source."""

    backend: str
    """``embedded`` for llama-cpp-python; the build's backend (``cpu``, ``cuda``...) for llama-server."""
    origin: str
    """``llama-cpp-python`` or ``source``."""
    path: str
    commit: str
    """The llama.cpp commit it was built from."""


def pinned_runtimes() -> tuple[PinnedRuntime, ...]:
    """The embedded engine's llama.cpp, and the pinned ``llama-server`` when it has been built."""
    from clover_local import llama_arch_table as pinned  # the pin itself, as the architecture check reads it

    found = [
        PinnedRuntime(
            "embedded",
            "llama-cpp-python",
            f"llama_cpp (llama-cpp-python {pinned.LLAMA_CPP_PYTHON})",
            pinned.LLAMA_CPP_COMMIT,
        )
    ]
    folder = settings.llama_server_dir()
    info = built_info()
    if info is not None and (folder / "llama-server").is_file():
        commit = str(info.get("llama_cpp_commit", pinned.LLAMA_CPP_COMMIT))
        found.append(
            PinnedRuntime(str(info.get("backend", "cpu")), "source", str(folder / "llama-server"), commit)
        )
    return tuple(found)


def built_info() -> dict[str, object] | None:
    """``build-info.json`` written by ``scripts/build-llama-server`` (version, commit, backend), if any."""
    return read_json_dict(settings.llama_server_dir() / "build-info.json")


def read_json_dict(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it cannot be read or holds something else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
