"""Hostile bytes where clover-local parses: GGUF headers built to crash or exhaust the parser (issue 27 item 9),
and model output built to make tool-call parsing quadratic (item 8). Each is a GGUFError naming the problem, or
done in linear time; never a RecursionError, ValueError or a multi-GB list."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import gguf
import pytest

from clover_local.engine.toolcalls import parse_calls
from clover_local.errors import GGUFError
from clover_local.gguf.header import read_local_header
from clover_local.gguf.parse import parse_header

T = gguf.GGUFValueType


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, vtype: T, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", vtype) + payload


def _header(*kvs: bytes) -> bytes:
    base = [_kv("general.architecture", T.STRING, _string("llama"))]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(base) + len(kvs)) + b"".join(base + list(kvs))


def _u32(key: str, value: int) -> bytes:
    return _kv(key, T.UINT32, struct.pack("<I", value))


def _f32(key: str, value: float) -> bytes:
    return _kv(key, T.FLOAT32, struct.pack("<f", value))


def _file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data + bytes(-len(data) % 32))  # tensor data starts aligned
    return path


def test_deeply_nested_arrays_are_a_gguf_error() -> None:
    depth = 100_000
    nested = b"".join(struct.pack("<IQ", T.ARRAY, 1) for _ in range(depth)) + struct.pack("<IQ", T.UINT8, 0)
    with pytest.raises(GGUFError, match="array of arrays"):
        parse_header(_header(_kv("x.nested", T.ARRAY, nested)))


@pytest.mark.parametrize(
    ("kvs", "message"),
    [
        ((_f32("llama.block_count", float("inf")),), "block_count is inf, not a whole number"),
        (
            (_u32("llama.block_count", 4), _f32("llama.embedding_length", float("nan"))),
            "embedding_length is nan",
        ),
        ((_u32("llama.block_count", 4), _f32("llama.embedding_length", 2.5)), "not a whole number"),
        ((_kv("llama.block_count", T.UINT64, struct.pack("<Q", 10**12)),), "block_count says 1000000000000"),
        ((_kv("llama.block_count", T.INT32, struct.pack("<i", -1)),), "out of range"),
        (
            (_u32("llama.block_count", 4), _kv("llama.embedding_length", T.UINT64, struct.pack("<Q", 2**60))),
            "out of range",
        ),
        ((_kv("general.alignment", T.FLOAT32, struct.pack("<f", float("nan"))),), "general.alignment"),
    ],
)
def test_impossible_numbers_are_gguf_errors_naming_the_key(
    tmp_path: Path, kvs: tuple[bytes, ...], message: str
) -> None:
    with pytest.raises(GGUFError, match=message.replace("(", r"\(")):
        read_local_header(_file(tmp_path, _header(*kvs)))


def test_a_huge_number_array_stays_compact(tmp_path: Path) -> None:
    """30M u8 values: a Python list of them would take 240 MB of pointers; the parser keeps 30 MB."""
    n = 30_000_000
    data = _header(_kv("x.blob", T.ARRAY, struct.pack("<IQ", T.UINT8, n) + bytes(n)))
    tracemalloc.start()
    try:
        header = parse_header(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not isinstance(header.kv["x.blob"], list) and len(header.kv["x.blob"]) == n
    assert peak < 3 * n


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + " " * 200_000,
        "<tool_call>x" + " " * 100_000 + "y",
        "<tool_call>" * 50_000,
        "<tool_call><function=f>" + "<parameter=" * 50_000,
        "<tool_call>\n<function=f>\n" + "<parameter=p>\n" * 50_000,
    ],
    ids=["spaces", "text-spaces-text", "openers", "unnamed-parameters", "parameters"],
)
def test_tool_call_parsing_is_linear_on_hostile_output(text: str) -> None:
    """On the regexes, 8,000 spaces took 0.8 s and time grew with the square: these would take minutes."""
    parse_calls(text, "qwen3_coder", [])
    parse_calls(text, "hermes", [])


def test_linear_parsing_reads_what_the_regexes_read() -> None:
    hermes = '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call> <tool_call>{"name": "b"}'
    assert [(c.name, c.arguments) for c in parse_calls(hermes, "hermes", [])] == [
        ("a", '{"x": 1}'),
        ("b", "{}"),
    ]
    xml = (
        "<tool_call>\n<function=get>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=note>a\nb<parameter=n>\n3\n</function>\n</tool_call>"
    )
    (call,) = parse_calls(xml, "qwen3_coder", [])
    assert call.name == "get" and call.arguments == '{"city": "Paris", "note": "a\\nb", "n": 3}'
