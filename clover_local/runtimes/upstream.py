"""What the latest upstream llama.cpp release can load, read before any model byte: its tag
(``<releases>/releases/latest`` -> ``tag_name``) and that tag's ``src/llama-arch.cpp`` (``<raw>/<tag>/...``).

The network part is :mod:`clover_local.runtimes.releases` over :mod:`clover_local.runtimes.net`, as for an
install (the offline switch, the token only to the API's origin, redirects one hop at a time). Both answers are
cached in :func:`clover_local.settings.cache_dir` (``upstream/``): a tag's source never changes, and the latest
tag is asked again after :data:`LATEST_TTL_S`. Offline, only the cache answers. Every failure is an
:class:`~clover_local.errors.UpstreamError` saying what could not be read.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from clover_local import settings
from clover_local.errors import RuntimeInstallError, UpstreamError
from clover_local.runtimes import net
from clover_local.runtimes.installed import valid_tag
from clover_local.runtimes.releases import fetch_release, fetch_source_file, source_file_url
from clover_local.user_files import write_atomically

LATEST_TTL_S = 6 * 3600
"""How long the latest release's tag is trusted before it is asked again."""
TIMEOUT_S = 10.0
"""A plan waits at most this long on each connection and read (an install waits longer)."""
ARCH_PATH = "src/llama-arch.cpp"
_OFFLINE_FIX = "Go online once (drop --offline / HF_HUB_OFFLINE), or install a runtime that knows the model."


@dataclass(frozen=True)
class UpstreamSource:
    """The latest release's tag and the text of its ``src/llama-arch.cpp``."""

    tag: str
    text: str
    source: str
    """Where the text came from (a URL, or the cached file), for messages."""


def latest_arch_source(*, offline: bool = False) -> UpstreamSource:
    """The latest upstream release's ``llama-arch.cpp``, each tag's fetched once and kept;
    :class:`UpstreamError` when it cannot be had (offline with nothing cached, the server unreachable, an answer
    that is not a release)."""
    tag = _latest_tag(offline)
    cached = _cache() / tag / "llama-arch.cpp"
    if cached.is_file():
        return UpstreamSource(tag, cached.read_text(encoding="utf-8", errors="replace"), str(cached))
    if offline:
        raise UpstreamError(
            f"Offline: llama.cpp {tag}'s llama-arch.cpp was not fetched before, and no server is asked.",
            _OFFLINE_FIX,
            offline=True,
        )
    url = source_file_url(tag, ARCH_PATH)
    with _as_upstream_error(), net.client(TIMEOUT_S) as http:
        text = fetch_source_file(tag, ARCH_PATH, http).decode("utf-8", errors="replace")
    if "LLM_ARCH_" not in text:
        raise UpstreamError(f"{url} is not llama.cpp's llama-arch.cpp (no LLM_ARCH_ names in it).")
    _write(cached, text)
    return UpstreamSource(tag, text, url)


def _latest_tag(offline: bool) -> str:
    """The latest release's tag, asked again after :data:`LATEST_TTL_S` (it is checked to be ``b<digits>``)."""
    kept = _cache() / "latest.json"
    try:
        raw = json.loads(kept.read_text(encoding="utf-8"))
        tag, asked = str(raw["tag"]), float(raw["asked"])
        if valid_tag(tag) and (offline or time.time() - asked < LATEST_TTL_S):
            return tag
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if offline:
        raise UpstreamError(
            "Offline: the latest llama.cpp release was not asked which architectures it knows.",
            _OFFLINE_FIX,
            offline=True,
        )
    with _as_upstream_error(), net.client(TIMEOUT_S) as http:
        tag = fetch_release("latest", http).tag
    _write(kept, json.dumps({"tag": tag, "asked": time.time()}))
    return tag


@contextlib.contextmanager
def _as_upstream_error() -> Iterator[None]:
    """The releases client's :class:`RuntimeInstallError` (worded for an install) as this module's
    :class:`UpstreamError`, with what it says and its fix."""
    try:
        yield
    except RuntimeInstallError as exc:
        raise UpstreamError(exc.what, exc.fix) from None


def _cache() -> Path:
    return settings.cache_dir() / "upstream"


def _write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs asking again
        write_atomically(path, text.encode("utf-8"))  # a name of its own: two processes asking never tear it
