"""Shared bits of the download tests: random GGUF-looking files on the fake Hub, and small checks."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import gguf
from hub_server import HubServer

from clover_local.fetch.remote_header import FIRST_READ_ARCH

REPO = "acme/Clover-Tiny-GGUF"
ARCH_READ = FIRST_READ_ARCH
"""What the architecture check before a download reads of a model file first (its header's first bytes), once
per file: later runs find the answer cached, or in the partial download."""


def gguf_header(arch: str = "llama") -> bytes:
    """The smallest real GGUF header: version 3, no tensors, one key, ``general.architecture``."""
    key, value = b"general.architecture", arch.encode()
    return (
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", len(key))
        + key
        + struct.pack("<IQ", gguf.GGUFValueType.STRING, len(value))
        + value
    )


def gguf_bytes(size: int, arch: str = "llama") -> bytes:
    """``size`` bytes shaped like a GGUF download: a real header naming ``arch`` (the architecture check
    before a download reads it), then random bytes."""
    header = gguf_header(arch)
    return header + os.urandom(size - len(header))


def sha256(data: bytes | Path) -> str:
    return hashlib.sha256(data if isinstance(data, bytes) else data.read_bytes()).hexdigest()


def add_shards(hub: HubServer, repo: str, base: str, sizes: list[int]) -> dict[str, bytes]:
    """Add a split GGUF ``{base}-0000i-of-0000n.gguf`` with shards of the given sizes."""
    n = len(sizes)
    out = {}
    for i, size in enumerate(sizes, start=1):
        path = f"{base}-{i:05d}-of-{n:05d}.gguf"
        out[path] = gguf_bytes(size)
        hub.add_file(repo, path, out[path])
    return out


def bytes_served_total(hub: HubServer, repo: str, paths: list[str]) -> int:
    return sum(hub.bytes_served(repo, p) for p in paths)
