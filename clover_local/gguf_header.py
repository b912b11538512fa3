"""Read a GGUF's header, from a local file or from the Hub, into the :class:`ModelDescription` the planner uses.

The header holds the architecture numbers (layers, heads, experts, context, recurrent sizes) and the tensor
table, which gives the exact bytes of every tensor: the planner then knows what is expert weight and what is
not, layer by layer, before anything is downloaded. A remote header is read with HTTP range requests (the first
few MB of a 23 GB file) and cached by ETag. Split GGUFs (``*-00001-of-00003.gguf``) are read shard by shard.
Hub failures become messages in one place, :func:`clover_local.fetch.hub.with_hub_errors`.

Parsing is :mod:`clover_local.gguf_parse` (why not ``gguf.GGUFReader`` is said there); turning the raw header
into a description is :mod:`clover_local.gguf_describe`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from clover_local import settings
from clover_local.errors import DownloadError, GGUFError, HubUnreachableError
from clover_local.gguf_describe import describe
from clover_local.gguf_parse import NeedMoreBytes, RawHeader, parse_header
from clover_local.model import ModelDescription

__all__ = ["cached_header_files", "read_local_header", "read_remote_header", "shard_names"]

FIRST_READ_REMOTE = 2 * 1024 * 1024
"""Bytes fetched first from the Hub; a larger header (big vocabularies) is fetched in about doubling steps."""
FIRST_READ_LOCAL = 16 * 1024 * 1024
"""Bytes read first from a local file: reading is cheap, parsing again is not, so start big."""
MAX_HEADER = 512 * 1024 * 1024
"""A header larger than this is treated as corrupt rather than fetched."""

T = TypeVar("T")
_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_names(filename: str) -> list[str]:
    """All shard names of a split GGUF (``x-00001-of-00003.gguf`` -> three names); ``[filename]`` otherwise."""
    m = _SPLIT_RE.match(filename)
    if not m:
        return [filename]
    count = int(m.group("count"))
    if count < 1:
        raise GGUFError(f"{filename!r} names a split GGUF of {count} shards.")
    return [f"{m.group('prefix')}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def read_local_header(path: Path) -> ModelDescription:
    """Describe a local GGUF from its header alone (a split GGUF: give any shard, all are read)."""
    path = Path(path)
    headers: list[RawHeader] = []
    total = 0
    for name in shard_names(path.name):
        shard = path.with_name(name)
        try:
            size = shard.stat().st_size
        except FileNotFoundError:
            missing = "it" if shard == path else f"shard {name}, next to {path.name}"
            raise GGUFError(f"GGUF file not found: {missing} ({shard}).") from None
        with shard.open("rb") as f:
            headers.append(
                _parse_growing(
                    lambda start, end, f=f: _read_range(f, start, end), size, str(shard), FIRST_READ_LOCAL
                )
            )
        total += size
    _check_shards(headers, path.name)
    return describe(headers, total, source=str(path))


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
    """Describe a GGUF on the Hub by fetching only its header (HTTP range requests), cached by ETag.

    Goes through huggingface_hub (``hf_hub_url``, ``get_session``, ``build_hf_headers``), so ``HF_ENDPOINT``
    and ``HF_TOKEN`` are respected. Errors are :class:`DownloadError` (Hub side) or :class:`GGUFError`.
    ``offline`` (None: ``HF_HUB_OFFLINE``) answers from the header cache only; ``timeout_s`` bounds each
    network wait (None: huggingface_hub's defaults); ``retries`` how many 429/503 answers are waited out
    (None: as for downloads).
    """
    from clover_local.fetch.hub import RATE_LIMIT_RETRIES

    access = _HubAccess(
        token=token,
        offline=offline,
        timeout_s=timeout_s,
        retries=RATE_LIMIT_RETRIES if retries is None else retries,
    )
    headers: list[RawHeader] = []
    total = 0
    for name in shard_names(filename):
        header, size = _remote_shard_header(repo_id, name, revision, access)
        headers.append(header)
        total += size
    _check_shards(headers, filename)
    rev = f"@{revision}" if revision else ""
    return describe(headers, total, source=f"hf://{repo_id}/{filename}{rev}")


# -- parsing bytes that arrive in pieces ------------------------------------------------------------------


def _parse_growing(read: Callable[[int, int], bytes], size: int, name: str, first: int) -> RawHeader:
    """Parse a header, reading more (about doubling) each time the parser runs out, never past ``size``."""
    buf = bytearray()
    want = min(first, size)
    while True:
        if want > len(buf):
            chunk = read(len(buf), want)
            if not chunk:
                break
            buf += chunk
        try:
            return parse_header(buf)
        except NeedMoreBytes as more:
            if len(buf) >= size or more.needed > size:
                break
            if more.needed > MAX_HEADER:
                raise GGUFError(
                    f"{name}: the GGUF header claims to be over {MAX_HEADER >> 20} MiB: corrupt."
                ) from None
            want = min(size, max(more.needed, 2 * len(buf)))
        except GGUFError as exc:
            raise GGUFError(f"{name}: {exc.what}", exc.fix) from None
    raise GGUFError(
        f"{name} is truncated: its GGUF header does not fit in its {size} bytes.",
        "Download it again; a partial download is not a model.",
    )


def _read_range(f: BinaryIO, start: int, end: int) -> bytes:
    f.seek(start)
    return f.read(end - start)


def _check_shards(headers: list[RawHeader], filename: str) -> None:
    """The shards must be the ones the name promises: each says it is shard i of n, with all the tensors."""
    count = headers[0].kv.get("split.count")
    if len(headers) == 1 and (count is None or int(count) == 1):
        return
    if len(headers) == 1:
        raise GGUFError(
            f"{filename} is one shard of {count}, but its name does not say which.",
            "Keep the shards' names as llama.cpp writes them: NAME-00001-of-0000N.gguf.",
        )
    for i, header in enumerate(headers):
        if header.kv.get("split.count") != len(headers) or header.kv.get("split.no") != i:
            raise GGUFError(
                f"{filename}: shard {i + 1} of {len(headers)} says it is shard "
                f"{int(header.kv.get('split.no', -1)) + 1} of {header.kv.get('split.count')}: mixed-up shards."
            )
    expected = headers[0].kv.get("split.tensors.count")
    found = sum(len(h.tensors) for h in headers)
    if expected is not None and int(expected) != found:
        raise GGUFError(f"{filename}: the shards hold {found} tensors, the first shard promises {expected}.")


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

    token: str | bool | None
    offline: bool | None
    timeout_s: float | None
    retries: int

    def call(self, call: Callable[[], T], repo_id: str, filename: str) -> T:
        from clover_local.fetch.hub import with_hub_errors

        what = f"read the GGUF header of {filename} in {repo_id}"
        return with_hub_errors(call, repo=repo_id, what=what, filename=filename, retries=self.retries)


def _remote_shard_header(
    repo_id: str, filename: str, revision: str | None, access: _HubAccess
) -> tuple[RawHeader, int]:
    """One shard's header and file size: from the cache when the Hub's ETag is known there, else fetched.

    Without the Hub (offline, or unreachable) the header last seen for this repo, revision and file is used.
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=revision)
    where = f"{filename} in {repo_id}"
    ref = _ref_path(repo_id, revision, filename)
    offline = constants.HF_HUB_OFFLINE if access.offline is None else access.offline
    timeout = constants.HF_HUB_ETAG_TIMEOUT if access.timeout_s is None else access.timeout_s
    try:
        if offline:
            raise HubUnreachableError(
                f"Offline (HF_HUB_OFFLINE is set, or --offline): cannot ask the Hub about {where},"
                " and no header of it is cached.",
                "Run once with the Hub reachable to cache it, or download the model.",
            )
        meta = access.call(
            lambda: get_hf_file_metadata(url, token=access.token, timeout=timeout), repo_id, filename
        )
    except HubUnreachableError:
        cached = _cached_from_ref(repo_id, ref)
        if cached is None:
            raise
        return cached
    if meta.size is None or not meta.etag:
        raise DownloadError(f"The Hub did not say the size and ETag of {where}.", "Try again later.")
    cache = _cache_path(repo_id, meta.etag)
    header = _parse_cached(cache)
    if header is None:
        header_bytes = bytearray()

        def fetch(start: int, end: int) -> bytes:
            data = access.call(
                lambda: _get_range(meta.location or url, start, end, access.token, access.timeout_s),
                repo_id,
                filename,
            )
            header_bytes[start:] = data
            return data

        header = _parse_growing(fetch, meta.size, where, FIRST_READ_REMOTE)
        _write_atomically(cache, bytes(header_bytes[: header.header_bytes]))
    _write_atomically(ref, f"{cache.name}\n{meta.size}\n".encode())
    return header, meta.size


def _cache_path(repo_id: str, etag: str) -> Path:
    """``<cache>/headers/<repo>/<etag>.bin``: the header bytes of the file with that ETag (its sha256 on the Hub)."""
    safe_etag = re.sub(r"[^0-9A-Za-z._-]", "_", etag.strip('"'))
    return settings.cache_dir() / "headers" / repo_id / f"{safe_etag}.bin"


def _ref_path(repo_id: str, revision: str | None, filename: str) -> Path:
    """Which cached header a revision's file had last time, for use without the Hub."""
    safe_rev = re.sub(r"[^0-9A-Za-z._-]", "_", revision or "main")
    return settings.cache_dir() / "headers" / repo_id / "refs" / safe_rev / filename


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
        header = _parse_cached(settings.cache_dir() / "headers" / repo_id / name)
    except (OSError, ValueError):
        return None
    return (header, int(size)) if header is not None else None


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _get_range(url: str, start: int, end: int, token: str | bool | None, timeout_s: float | None) -> bytes:
    """Bytes ``[start, end)`` of a Hub file; reads no further even if the server ignores the Range header.

    ``timeout_s`` bounds each wait for the server (connect, each read); None waits as long as it takes."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers(token=token)
    headers["Range"] = f"bytes={start}-{end - 1}"
    headers["Accept-Encoding"] = "identity"
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
