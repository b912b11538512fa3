"""Read a local GGUF's header (architecture numbers, and the tensor table: exact bytes of every tensor, expert
or not, layer by layer) into the :class:`ModelDescription` the planner uses; a split GGUF
(``*-00001-of-00003.gguf``) shard by shard. Why not ``gguf.GGUFReader``: :mod:`clover_local.gguf.parse`; the
same header from the Hub: :mod:`clover_local.fetch.remote_header`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from clover_local.errors import GGUFError
from clover_local.gguf.describe import describe
from clover_local.gguf.model import ModelDescription
from clover_local.gguf.names import SHARD_RE
from clover_local.gguf.parse import NeedMoreBytes, RawHeader, parse_header

__all__ = ["check_shards", "header_of", "parse_growing", "read_local_header", "shard_names"]

T = TypeVar("T")

FIRST_READ_LOCAL = 16 * 1024 * 1024
"""Bytes read first from a local file: reading is cheap, parsing again is not, so start big."""
MAX_HEADER = 512 * 1024 * 1024
"""A header larger than this is treated as corrupt rather than fetched."""


def shard_names(filename: str) -> list[str]:
    """All shard names of a split GGUF (``x-00001-of-00003.gguf`` -> three names); ``[filename]`` otherwise."""
    if not (m := SHARD_RE.match(filename)):
        return [filename]
    count = int(m.group("count"))
    if count < 1:
        raise GGUFError(f"{filename!r} names a split GGUF of {count} shards.")
    suffix = filename[-len(".gguf") :]
    return [f"{m.group('base')}-{i:05d}-of-{count:05d}{suffix}" for i in range(1, count + 1)]


def header_of(path: Path) -> ModelDescription:
    """A local GGUF's header, read once per file version (its path, size and modification time): every step
    of a command that asks about the same file gets the same answer without reading it again (a 262k-token
    vocabulary takes most of a second to parse)."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise GGUFError(f"GGUF file not found: it ({path}).") from None
    return _header_of(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _header_of(path: str, size: int, mtime_ns: int) -> ModelDescription:
    return read_local_header(Path(path))


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
            read = functools.partial(_read_range, f)
            headers.append(parse_growing(read, size, str(shard), FIRST_READ_LOCAL, parse_header))
        _check_complete(headers[-1], size, shard)
        total += size
    check_shards(headers, path.name)
    return describe(headers, total, source=str(path))


def _check_complete(header: RawHeader, size: int, path: Path) -> None:
    """A GGUF whose tensor table reaches past the end of the file was cut short (an interrupted copy
    or download): say so before anything is planned or loaded from it."""
    needed = header.data_offset + max((t.offset + t.n_bytes for t in header.tensors), default=0)
    if size < needed:
        raise GGUFError(
            f"{path} is truncated: its tensor table needs {needed:,} bytes but the file has {size:,}"
            f" ({needed - size:,} missing).",
            "Download or copy it again (`clover-local download` continues an interrupted download;"
            " `clover-local verify` checks a downloaded file).",
        )


# -- parsing bytes that arrive in pieces ------------------------------------------------------------------


def parse_growing(
    read: Callable[[int, int], bytes],
    size: int,
    name: str,
    first: int,
    parse: Callable[[bytearray], T],
) -> T:
    """Parse a header (``parse``: the whole of it, or a part such as :func:`parse_architecture`), reading more
    (about doubling) each time the parser runs out, never past ``size``."""
    buf = bytearray()
    want = min(first, size)
    while True:
        if want > len(buf):
            chunk = read(len(buf), want)
            if not chunk:
                break
            buf += chunk
        try:
            return parse(buf)
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


def check_shards(headers: list[RawHeader], filename: str) -> None:
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
