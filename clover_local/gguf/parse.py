"""The smallest GGUF header parser that works on the first bytes of a file, built on the ``gguf`` package's enums.

Why not ``gguf.GGUFReader``: it needs the whole file (it memory-maps it and builds a view of every tensor's
data, so the first megabytes fetched from the Hub cannot be read), and it builds a numpy view per string, so a
262,144-token vocabulary takes about 20 s on a small CPU. This parser reads only the header: the key/value
metadata and the tensor table. It uses gguf's value types (``GGUFValueType``), quantization types
(``GGMLQuantizationType``) and block sizes (``GGML_QUANT_SIZES``), so it has no tables of its own.

When the bytes run out it raises :class:`NeedMoreBytes` with the least total length it now knows it needs, so
a caller fetching over HTTP can ask for more and try again.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import gguf
import numpy as np

from clover_local.errors import GGUFError

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_MAX_COUNT = 1 << 31
"""Sanity limit on counts and lengths: anything larger means a corrupt or foreign file."""
MAX_LISTED = 1 << 22
"""Longest number array turned into a Python list (a vocabulary's scores are ~260K); a longer one stays a
compact numpy array (a list of 300M small ints would take GBs), which no key a plan reads needs."""

_SCALARS: dict[gguf.GGUFValueType, str] = {
    gguf.GGUFValueType.UINT8: "<B",
    gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H",
    gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I",
    gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f",
    gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q",
    gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}


class StringArray(Sequence[str]):
    """A GGUF array of strings, decoded only where read. A vocabulary is 150-260 thousand strings and planning
    only needs how many there are: decoding them all made every plan (and the TUI's first paint) about half a
    second slower."""

    def __init__(self, raw: bytes, starts: list[int]) -> None:
        self._buf = raw
        self._starts = starts
        """Offset in ``raw`` of each string's length prefix (u64), then its bytes."""

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._decode(p) for p in self._starts[i]]
        return self._decode(self._starts[i])

    def _decode(self, pos: int) -> str:
        (n,) = struct.unpack_from("<Q", self._buf, pos)
        return bytes(self._buf[pos + 8 : pos + 8 + n]).decode("utf-8", errors="replace")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


class NeedMoreBytes(Exception):
    """The buffer ends inside the header; ``needed`` is the least total length that can get further."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"GGUF header needs at least {needed} bytes")
        self.needed = needed


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: gguf.GGMLQuantizationType
    offset: int
    """Offset of the tensor's data from the start of the data section."""
    n_bytes: int
    """Exact size of the tensor's data: elements / block size * bytes per block."""


@dataclass(frozen=True)
class RawHeader:
    """What a GGUF header holds, undigested: metadata by key and the tensor table."""

    version: int
    kv: dict[str, Any]
    """Scalars as Python values, arrays as lists (arrays of strings as :class:`StringArray`)."""
    tensors: tuple[TensorInfo, ...]
    header_bytes: int
    """Length of the header proper (up to the end of the tensor table): what must be fetched to parse it."""
    data_offset: int
    """Where tensor data starts: the header rounded up to ``general.alignment``."""


class _Cursor:
    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise NeedMoreBytes(self.pos + n)

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def count(self, what: str) -> int:
        n = self.scalar("<Q")
        if n > _MAX_COUNT:
            raise GGUFError(f"The GGUF header is corrupt: {what} of {n} is impossible.")
        return int(n)

    def string(self) -> str:
        n = self.count("a string length")
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        kind = _value_type(vtype, "value")
        if kind == gguf.GGUFValueType.STRING:
            return self.string()
        if kind == gguf.GGUFValueType.ARRAY:
            return self.array()
        return self.scalar(_SCALARS[kind])

    def array(self) -> list[Any] | StringArray:
        item_type = self.scalar("<I")
        n = self.count("an array length")
        kind = _value_type(item_type, "array")
        if kind in _SCALARS:
            dtype = np.dtype(_SCALARS[kind])
            self.need(n * dtype.itemsize)
            array = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos)
            self.pos += n * dtype.itemsize
            return array.tolist() if n <= MAX_LISTED else array.copy()  # type: ignore[return-value]
        if kind == gguf.GGUFValueType.STRING:
            return self.strings(n)
        # An array of arrays: llama.cpp's gguf reader refuses them too, and following them would recurse
        # as deep as a hostile file nests.
        raise GGUFError(
            "The GGUF header is corrupt: it holds an array of arrays, which GGUF files never hold."
        )

    def strings(self, n: int) -> StringArray:
        """``n`` strings, stepped over (lengths checked, bytes not decoded)."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        starts: list[int] = []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(n):
            if pos + 8 > end:
                raise NeedMoreBytes(pos + 8)
            (length,) = unpack(buf, pos)
            if length > _MAX_COUNT:
                raise GGUFError(f"The GGUF header is corrupt: a string length of {length} is impossible.")
            starts.append(pos)
            pos += 8 + length
        if pos > end:
            raise NeedMoreBytes(pos)
        first = self.pos
        self.pos = pos
        # A copy of the array's bytes (one memcpy): the caller's buffer may grow or go away.
        return StringArray(bytes(buf[first:pos]), [p - first for p in starts])


def _value_type(raw: int, what: str) -> gguf.GGUFValueType:
    try:
        return gguf.GGUFValueType(raw)
    except ValueError:
        raise GGUFError(f"The GGUF header is corrupt: unknown {what} type {raw}.") from None


def parse_header(buf: bytes | bytearray | memoryview) -> RawHeader:
    """Parse a GGUF header from the first bytes of a file.

    Raises :class:`NeedMoreBytes` when ``buf`` ends inside the header and :class:`GGUFError` when the bytes
    are not a GGUF header this parser understands.
    """
    cur, version, n_tensors, n_kv = _preamble(buf)
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        kv[key] = cur.value(cur.scalar("<I"))
    tensors = [_tensor_info(cur) for _ in range(n_tensors)]
    header_bytes = cur.pos
    alignment = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or not 0 < alignment <= 1 << 20:
        raise GGUFError(f"The GGUF header is corrupt: general.alignment is {alignment!r}.")
    data_offset = -(-header_bytes // alignment) * alignment
    return RawHeader(version, kv, tuple(tensors), header_bytes, data_offset)


def parse_architecture(buf: bytes | bytearray | memoryview) -> str:
    """``general.architecture`` from the first bytes of a GGUF, reading no further than that key.

    llama.cpp's converters write it first, so a few hundred bytes answer for any model, whatever the size of
    its vocabulary. Raises :class:`NeedMoreBytes` and :class:`GGUFError` as :func:`parse_header` does, and
    :class:`GGUFError` when the header has no such key.
    """
    cur, _, _, n_kv = _preamble(buf)
    for _ in range(n_kv):
        key = cur.string()
        value = cur.value(cur.scalar("<I"))
        if key == "general.architecture":
            if not isinstance(value, str) or not value:
                raise GGUFError(f"The GGUF header's general.architecture is {value!r}, not a name.")
            return value
    raise GGUFError("The GGUF header has no general.architecture: llama.cpp cannot load it.")


def _preamble(buf: bytes | bytearray | memoryview) -> tuple[_Cursor, int, int, int]:
    """The cursor after the fixed start of a header, with the version, tensor count and key/value count."""
    cur = _Cursor(buf)
    cur.need(4)
    if bytes(cur.buf[:4]) != b"GGUF":
        raise GGUFError("This is not a GGUF file (it does not start with the GGUF magic bytes).")
    cur.pos = 4
    version = cur.scalar("<I")
    if version not in SUPPORTED_VERSIONS:
        hint = " (a big-endian file?)" if version > 0xFFFF else ""
        raise GGUFError(
            f"Unsupported GGUF version {version}{hint}: clover-local reads versions 2 and 3.",
            "Use a GGUF converted by a recent llama.cpp.",
        )
    n_tensors = cur.count("a tensor count")
    n_kv = cur.count("a key/value count")
    return cur, version, n_tensors, n_kv


def _tensor_info(cur: _Cursor) -> TensorInfo:
    name = cur.string()
    n_dims = cur.scalar("<I")
    if n_dims > 8:
        raise GGUFError(f"The GGUF header is corrupt: tensor {name!r} has {n_dims} dimensions.")
    shape = tuple(int(cur.scalar("<Q")) for _ in range(n_dims))
    raw_type = cur.scalar("<I")
    offset = cur.scalar("<Q")
    try:
        ggml_type = gguf.GGMLQuantizationType(raw_type)
        block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
    except (ValueError, KeyError):
        raise GGUFError(
            f"Tensor {name!r} has ggml type {raw_type}, which this version of the gguf package does not know.",
            "Upgrade the gguf package (pip install -U gguf).",
        ) from None
    n_elements = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if n_elements % block:
        raise GGUFError(f"The GGUF header is corrupt: tensor {name!r} is not a whole number of blocks.")
    return TensorInfo(name, shape, ggml_type, int(offset), n_elements // block * type_size)
