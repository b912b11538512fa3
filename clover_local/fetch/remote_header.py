"""Read a GGUF's header from the Hub with HTTP range requests (the first few MB of a 23 GB file), shard by shard,
into the same :class:`ModelDescription` a local file gives (:mod:`clover_local.gguf.header`). The headers are
cached by ETag under ``<cache>/headers/``, which answers when the Hub cannot be reached (offline, or down).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from clover_local import settings
from clover_local.errors import DownloadError, GGUFError, HubUnreachableError
from clover_local.fetch import cache as hf_cache
from clover_local.fetch.hub import RATE_LIMIT_RETRIES, headers_for, with_hub_errors
from clover_local.gguf.describe import describe
from clover_local.gguf.header import check_shards, parse_growing, shard_names
from clover_local.gguf.model import ModelDescription
from clover_local.gguf.parse import NeedMoreBytes, RawHeader, parse_architecture, parse_header
from clover_local.user_files import write_atomically

__all__ = ["cached_header_files", "read_remote_architecture", "read_remote_header"]

FIRST_READ_REMOTE = 2 * 1024 * 1024
"""Bytes fetched first from the Hub; a larger header (big vocabularies) is fetched in about doubling steps."""
FIRST_READ_ARCH = 4 * 1024
"""Bytes fetched first for ``general.architecture`` alone: converters write it first, so this is the whole cost
(less than any real model's header, whose tensor table alone is larger)."""

T = TypeVar("T")


def read_remote_header(
    repo_id: str,
    filename: str,
    revision: str | None = None,
    token: str | bool | None = None,
    *,
    offline: bool | None = None,
    timeout_s: float | None = None,
    retries: int | None = None,
) -> ModelDescription:
    """Describe a GGUF on the Hub from its header alone, through huggingface_hub (so ``HF_ENDPOINT`` and
    ``HF_TOKEN`` hold). Errors are :class:`DownloadError` (Hub side) or :class:`GGUFError`. ``offline`` (None:
    ``HF_HUB_OFFLINE``) answers from the header cache only; ``timeout_s`` bounds each network wait (None:
    huggingface_hub's defaults); ``retries`` how many 429/503 answers are waited out (None: as for downloads).
    """
    access = _HubAccess(token, offline, timeout_s, RATE_LIMIT_RETRIES if retries is None else retries)
    headers: list[RawHeader] = []
    total = 0
    for name in shard_names(filename):
        header, size = _remote_shard_header(repo_id, name, revision, access)
        headers.append(header)
        total += size
    check_shards(headers, filename)
    rev = f"@{revision}" if revision else ""
    return describe(headers, total, source=f"hf://{repo_id}/{filename}{rev}")


def read_remote_architecture(repo_id: str, filename: str, revision: str | None = None) -> str:
    """``general.architecture`` of a GGUF on the Hub, from as few bytes as can tell (the first shard of a
    split GGUF names the model's): none when the file's header or architecture is cached for its ETag, or its
    first bytes are on disk already (a partial download), else the first :data:`FIRST_READ_ARCH` bytes (more
    only when the key comes late).

    For the check before a download, which needs the Hub anyway: errors are :class:`DownloadError` (offline,
    unreachable, not found) or :class:`GGUFError` (not a GGUF, no architecture)."""
    access = _HubAccess()
    name = shard_names(filename)[0]
    meta = _file_metadata(repo_id, name, revision, access)
    cache = _cache_path(repo_id, meta.etag)
    header = _parse_cached(cache)
    if header is not None and isinstance(header.kv.get("general.architecture"), str):
        return str(header.kv["general.architecture"])
    known = cache.with_suffix(".arch")
    if known.is_file() and (arch := known.read_text(encoding="utf-8").strip()):
        return arch
    if (on_disk := _architecture_on_disk(repo_id, meta.etag)) is not None:
        return on_disk
    read = access.reader(meta, repo_id, name)
    arch = parse_growing(read, meta.size, f"{name} in {repo_id}", FIRST_READ_ARCH, parse_architecture)
    write_atomically(known, arch.encode())
    return arch


def _architecture_on_disk(repo_id: str, etag: str) -> str | None:
    """The architecture from the file's first bytes when a download of it (finished, or a partial of ours or
    of huggingface_hub's) already has them."""
    candidates = [hf_cache.blob_path(repo_id, etag), hf_cache.partial_path(repo_id, etag)]
    for path in [*candidates, *hf_cache.hf_partials(repo_id, etag)]:
        try:
            with path.open("rb") as f:
                return parse_architecture(f.read(FIRST_READ_ARCH))
        except (OSError, NeedMoreBytes, GGUFError):
            continue
    return None


def cached_header_files(repo_id: str, revision: str | None = None) -> list[str]:
    """Files of ``repo_id`` at ``revision`` whose header is in the cache (readable without the Hub)."""
    root = _ref_path(repo_id, revision, "x").parent
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# -- the Hub ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _HubAccess:
    """How to talk to the Hub for one header read."""

    token: str | bool | None = None
    offline: bool | None = None
    timeout_s: float | None = None
    retries: int = RATE_LIMIT_RETRIES

    def call(self, call: Callable[[], T], repo_id: str, filename: str) -> T:
        what = f"read the GGUF header of {filename} in {repo_id}"
        return with_hub_errors(call, repo=repo_id, what=what, filename=filename, retries=self.retries)

    def reader(self, meta: _FileMeta, repo_id: str, filename: str) -> Callable[[int, int], bytes]:
        """Reads bytes ``[start, end)`` of the file (:func:`_get_range`), Hub errors made messages."""
        return lambda start, end: self.call(
            lambda: _get_range(meta.url, start, end, self.token, self.timeout_s), repo_id, filename
        )


def _remote_shard_header(
    repo_id: str, filename: str, revision: str | None, access: _HubAccess
) -> tuple[RawHeader, int]:
    """One shard's header and file size: from the cache when the Hub's ETag is known there, else fetched.

    Without the Hub (offline, or unreachable) the header last seen for this repo, revision and file is used.
    """
    ref = _ref_path(repo_id, revision, filename)
    try:
        meta = _file_metadata(repo_id, filename, revision, access)
    except HubUnreachableError:
        if (cached := _cached_from_ref(repo_id, ref)) is None:
            raise
        return cached
    cache = _cache_path(repo_id, meta.etag)
    if (header := _parse_cached(cache)) is None:
        read = access.reader(meta, repo_id, filename)
        header_bytes = bytearray()

        def fetch(start: int, end: int) -> bytes:
            data = read(start, end)
            header_bytes[start:] = data
            return data

        header = parse_growing(fetch, meta.size, f"{filename} in {repo_id}", FIRST_READ_REMOTE, parse_header)
        # Each write under a temporary name of its own: two processes reading headers never collide.
        write_atomically(cache, bytes(header_bytes[: header.header_bytes]))
    write_atomically(ref, f"{cache.name}\n{meta.size}\n".encode())
    return header, meta.size


@dataclass(frozen=True)
class _FileMeta:
    size: int
    etag: str
    url: str
    """Where its bytes are: the Hub's redirect target, else the resolve URL."""


def _file_metadata(repo_id: str, filename: str, revision: str | None, access: _HubAccess) -> _FileMeta:
    """The file's size, ETag and where its bytes are, from the Hub (a HEAD request on its resolve URL)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=revision)
    where = f"{filename} in {repo_id}"
    offline = constants.HF_HUB_OFFLINE if access.offline is None else access.offline
    timeout = constants.HF_HUB_ETAG_TIMEOUT if access.timeout_s is None else access.timeout_s
    if offline:
        raise HubUnreachableError(
            f"Offline (HF_HUB_OFFLINE is set, or --offline): cannot ask the Hub about {where},"
            " and no header of it is cached.",
            "Run once with the Hub reachable to cache it, or download the model.",
        )
    meta = access.call(
        lambda: get_hf_file_metadata(url, token=access.token, timeout=timeout), repo_id, filename
    )
    if meta.size is None or not meta.etag:
        raise DownloadError(f"The Hub did not say the size and ETag of {where}.", "Try again later.")
    return _FileMeta(meta.size, hf_cache.check_etag(meta.etag.strip('"')), meta.location or url)


def _cache_path(repo_id: str, etag: str) -> Path:
    """``<cache>/headers/<repo>/<etag>.bin``: the header bytes of the file with that ETag (its sha256 on the Hub)."""
    safe_etag = re.sub(r"[^0-9A-Za-z._-]", "_", etag.strip('"'))
    return _headers(repo_id) / f"{safe_etag}.bin"


def _ref_path(repo_id: str, revision: str | None, filename: str) -> Path:
    """Which cached header a revision's file had last time, for use without the Hub."""
    safe_rev = re.sub(r"[^0-9A-Za-z._-]", "_", revision or "main")
    return _headers(repo_id) / "refs" / safe_rev / filename


def _headers(repo_id: str) -> Path:
    return settings.cache_dir() / "headers" / repo_id


def _parse_cached(cache: Path) -> RawHeader | None:
    try:
        return parse_header(cache.read_bytes())
    except FileNotFoundError:
        return None
    except (NeedMoreBytes, GGUFError):
        cache.unlink(missing_ok=True)  # a damaged cache entry: fetch again
        return None


def _cached_from_ref(repo_id: str, ref: Path) -> tuple[RawHeader, int] | None:
    try:
        name, size = ref.read_text().split()
        header = _parse_cached(_headers(repo_id) / name)
    except (OSError, ValueError):
        return None
    return (header, int(size)) if header is not None else None


def _get_range(url: str, start: int, end: int, token: str | bool | None, timeout_s: float | None) -> bytes:
    """Bytes ``[start, end)`` of a Hub file; reads no further even if the server ignores the Range header.

    ``timeout_s`` bounds each wait for the server (connect, each read); None waits as long as it takes."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    # No token for a CDN or any host but the endpoint (headers_for).
    headers = {**headers_for(url, token), "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    out = bytearray()
    with get_session().stream(
        "GET", url, headers=headers, follow_redirects=True, timeout=timeout_s
    ) as response:
        hf_raise_for_status(response)
        skip = start if response.status_code == 200 else 0  # a server that ignored Range sends from 0
        for chunk in response.iter_bytes():
            if skip:
                dropped = min(skip, len(chunk))
                chunk, skip = chunk[dropped:], skip - dropped
            out += chunk
            if len(out) >= end - start:
                break
    return bytes(out[: end - start])
