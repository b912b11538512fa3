#!/usr/bin/env python3
"""Planned vs real on this machine's NVIDIA GPU: memory (NVML, per process) and decode speed, for llama-bench,
llama-server and the embedded engine, side by side. Needs a GPU, a CUDA llama-server/llama-bench
(scripts/build-llama-server) and a CUDA llama-cpp-python (or LLAMA_CPP_LIB_PATH pointing at CUDA libllama).

    .venv/bin/python benchmarks/check_gpu.py --model MODEL.gguf [--free 20G,12G] [--out report.json]
    .venv/bin/python benchmarks/check_gpu.py --make-clover-shaped /tmp/clover.gguf --free 20G,12G

--free emulates smaller cards by holding GPU memory in another process (PyTorch) so only that much is free.
The same check is `clover-local doctor --measure`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clover_local.detect.units import parse_size


def parse_free_list(text: str) -> list[int]:
    sizes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        size = parse_size(part)
        if size is None or size <= 0:
            raise SystemExit(f"--free: {part!r} is not a size like 12G")
        sizes.append(size)
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="a local GGUF")
    src.add_argument(
        "--make-clover-shaped",
        type=Path,
        metavar="PATH",
        help="write a Clover-shaped random Q4_K_M there first",
    )
    parser.add_argument("--preset", default="clover-35b-a3b", help="whose settings to plan with")
    parser.add_argument(
        "--free", default="", help="also emulate cards with this much free memory, e.g. 20G,12G"
    )
    parser.add_argument("--ctx", type=int, help="context (default: as planned)")
    parser.add_argument("--engines", default="llama-bench,llama-server,embedded,fit-params")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args()

    from clover_local.errors import CloverError
    from clover_local.measure.gpu_check import format_reports, reports_to_json, run_case

    frees = parse_free_list(args.free)
    model = args.model
    if model is not None and not model.is_file():
        raise SystemExit(f"--model {model}: no such file.")
    if args.make_clover_shaped:
        from clover_local.testing.clover_shaped import write_clover_shaped

        model = args.make_clover_shaped
        if not model.exists():
            write_clover_shaped(model)
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    reports = []
    try:
        whole = tuple(e for e in engines if e != "fit-params")  # everything fits: nothing to compare
        reports.append(run_case("whole GPU", model, preset=args.preset, ctx=args.ctx, engines=whole))
        for free in frees:
            name = f"{free / 1024**3:.0f} GiB free"
            smaller = tuple(e for e in engines if e != "llama-server")  # its memory is known from the first
            reports.append(
                run_case(name, model, preset=args.preset, free_bytes=free, ctx=args.ctx, engines=smaller)
            )
            if args.out:
                args.out.write_text(json.dumps(reports_to_json(reports), indent=1))
    except CloverError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if not reports:
            return 1
    if args.out:
        args.out.write_text(json.dumps(reports_to_json(reports), indent=1))
    print(format_reports(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
