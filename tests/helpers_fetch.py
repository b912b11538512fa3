"""Shared bits of the download tests: random GGUF-looking files on the fake Hub, and small checks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hub_server import HubServer

REPO = "acme/Clover-Tiny-GGUF"


def gguf_bytes(size: int) -> bytes:
    """``size`` random bytes that start like a GGUF (enough for clover-local's magic check)."""
    return b"GGUF" + os.urandom(size - 4)


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
