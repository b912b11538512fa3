"""What the latest upstream llama.cpp release can load, read before any model byte: its tag
(``<releases>/releases/latest`` -> ``tag_name``) and that tag's ``src/llama-arch.cpp`` (``<raw>/<tag>/...``).

Both are cached in :func:`clover_local.settings.cache_dir` (``upstream/``): a tag's source never changes, and the
latest tag is asked again after :data:`LATEST_TTL_S`. Offline, only the cache answers. Every failure is an
:class:`~clover_local.errors.UpstreamError` saying what could not be read.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from clover_local import settings
from clover_local.errors import UpstreamError
from clover_local.runtimes.installed import valid_tag

LATEST_TTL_S = 6 * 3600
"""How long the latest release's tag is trusted before it is asked again."""
TIMEOUT_S = 10.0
_MAX_ARCH_SOURCE = 8 << 20
"""llama-arch.cpp is ~100 kB; a longer answer is not it."""


@dataclass(frozen=True)
class UpstreamSource:
    """The latest release's tag and the text of its ``src/llama-arch.cpp``."""

    tag: str
    text: str
    source: str
    """Where the text came from (a URL, or the cached file), for messages."""


def latest_arch_source(*, offline: bool = False, timeout_s: float = TIMEOUT_S) -> UpstreamSource:
    """The latest upstream release's ``llama-arch.cpp`` (cached); :class:`UpstreamError` when it cannot be had
    (offline with nothing cached, the server unreachable, an answer that is not a release)."""
    tag = _latest_tag(offline, timeout_s)
    return arch_source(tag, offline=offline, timeout_s=timeout_s)


def arch_source(tag: str, *, offline: bool = False, timeout_s: float = TIMEOUT_S) -> UpstreamSource:
    """Release ``tag``'s ``src/llama-arch.cpp``, fetched once and kept."""
    if not valid_tag(tag):
        raise UpstreamError(f"{tag!r} is not a llama.cpp release tag (b<number>).")
    cached = _cache() / tag / "llama-arch.cpp"
    if cached.is_file():
        return UpstreamSource(tag, cached.read_text(encoding="utf-8", errors="replace"), str(cached))
    url = f"{settings.llamacpp_raw_url().rstrip('/')}/{tag}/src/llama-arch.cpp"
    if offline:
        raise UpstreamError(
            f"Offline: llama.cpp {tag}'s llama-arch.cpp was not fetched before, and no server is asked.",
            "Go online once (drop --offline / HF_HUB_OFFLINE), or install a runtime that knows the model.",
        )
    text = _get(url, timeout_s).decode("utf-8", errors="replace")
    if "LLM_ARCH_" not in text:
        raise UpstreamError(f"{url} is not llama.cpp's llama-arch.cpp (no LLM_ARCH_ names in it).")
    _write(cached, text)
    return UpstreamSource(tag, text, url)


def _latest_tag(offline: bool, timeout_s: float) -> str:
    kept = _cache() / "latest.json"
    try:
        raw = json.loads(kept.read_text(encoding="utf-8"))
        tag, asked = str(raw["tag"]), float(raw["asked"])
        if valid_tag(tag) and (offline or time.time() - asked < LATEST_TTL_S):
            return tag
    except (OSError, ValueError, KeyError, TypeError):
        pass
    url = f"{settings.llamacpp_releases_url().rstrip('/')}/releases/latest"
    if offline:
        raise UpstreamError(
            "Offline: the latest llama.cpp release was not asked which architectures it knows.",
            "Go online once (drop --offline / HF_HUB_OFFLINE), or install a runtime that knows the model.",
        )
    try:
        tag = json.loads(_get(url, timeout_s))["tag_name"]
    except (ValueError, KeyError, TypeError):
        raise UpstreamError(f"{url} did not answer with a release (no tag_name).") from None
    if not (isinstance(tag, str) and valid_tag(tag)):
        raise UpstreamError(f"{url} names the latest release {tag!r}, not a llama.cpp tag (b<number>).")
    _write(kept, json.dumps({"tag": tag, "asked": time.time()}))
    return tag


def _get(url: str, timeout_s: float) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "clover-local", "Accept": "*/*"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            data: bytes = reply.read(_MAX_ARCH_SOURCE + 1)
    except urllib.error.HTTPError as exc:
        raise UpstreamError(f"{url} answered HTTP {exc.code}.") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UpstreamError(
            f"{url} could not be reached ({reason}).",
            "Check the network (CLOVER_LLAMACPP_RELEASES / CLOVER_LLAMACPP_RAW name the servers), or plan "
            "with --offline.",
        ) from None
    if len(data) > _MAX_ARCH_SOURCE:
        raise UpstreamError(f"{url} answered more than {_MAX_ARCH_SOURCE >> 20} MiB: not what was asked for.")
    return data


def _cache() -> Path:
    return settings.cache_dir() / "upstream"


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written only costs asking again
