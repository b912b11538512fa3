#!/usr/bin/env python3
"""Engine benchmark (JSON out): docs/measurements.md's engine table comes from this.

    .venv/bin/python benchmarks/bench_engine.py --rounds 5 --out .bench/engine.json

Same options as ``clover-local bench``; prints the Markdown table and writes the JSON report.
"""

from __future__ import annotations

import sys

from clover_local.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        from pathlib import Path

        Path(".bench").mkdir(exist_ok=True)
        args += ["--out", ".bench/engine.json"]
    raise SystemExit(main(["bench", *args]))
