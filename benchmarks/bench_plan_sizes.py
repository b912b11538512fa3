#!/usr/bin/env python3
"""What planning from the Hub's GGUF header costs, side by side with planning from the preset's estimate.

The real Gemma 3 270M Q4_K_M GGUF (253 MB, a 262,144-token vocabulary, so a large header) is served by the
local fake Hub (``tests/hub_server.py`` on 127.0.0.1) under a user preset copied from ``gemma3-270m`` without
its Python package, so ``clover-local plan`` must ask the Hub. Each run is a fresh ``clover-local plan --json``
process with its own cache folders; the medians of ``--runs`` runs are compared:

- ``estimate``: ``--offline`` with nothing cached (the preset's sizes; no request),
- ``cold``: the header read with range requests (empty header cache),
- ``warm``: the header cache filled (the repo listing and one HEAD; no header bytes),
- ``offline``: ``--offline`` with the header cached (no request).

    .venv/bin/python benchmarks/bench_plan_sizes.py            # 5 runs each
    .venv/bin/python benchmarks/bench_plan_sizes.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hub_server import HubServer  # noqa: E402

REPO = "bench/Gemma-3-270M-GGUF"
FILE = "gemma-3-270m-Q4_K_M.gguf"


def preset_text() -> str:
    """The shipped Gemma preset, renamed, pointed at the fake repo, and without its Python package."""
    text = (ROOT / "presets" / "gemma3-270m.toml").read_text()
    text = re.sub(r'(?m)^name = ".*"$', 'name = "bench-gemma"', text)
    text = re.sub(r'(?m)^repo = ".*"$', f'repo = "{REPO}"', text)
    return re.sub(r"(?m)^python_package = .*$", "", text)


def plan_once(env: dict[str, str], *extra: str) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "clover-local"), "plan", "--preset", "bench-gemma", "--json", *extra],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from clover_local.testing.models import gemma_path

    model = gemma_path()
    size = model.stat().st_size
    hub = HubServer().start()
    hub.add_file(REPO, FILE, model)
    times: dict[str, list[float]] = {"estimate": [], "cold": [], "warm": [], "offline": []}
    served: dict[str, list[int]] = {k: [] for k in times}
    requests: dict[str, list[int]] = {k: [] for k in times}
    try:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
                root = Path(tmp)
                (root / "config" / "presets").mkdir(parents=True)
                (root / "config" / "presets" / "bench-gemma.toml").write_text(preset_text())
                env = {
                    **os.environ,
                    "CLOVER_CONFIG_DIR": str(root / "config"),
                    "CLOVER_DATA_DIR": str(root / "data"),
                    "CLOVER_CACHE_DIR": str(root / "cache"),
                    "HF_HOME": str(root / "hf"),
                    "HF_HUB_CACHE": str(root / "hf" / "hub"),
                    "HF_ENDPOINT": hub.url,
                }
                env.pop("HF_HUB_OFFLINE", None)
                for kind, extra in (
                    ("estimate", ("--offline",)),
                    ("cold", ()),
                    ("warm", ()),
                    ("offline", ("--offline",)),
                ):
                    hub.reset_counters()
                    seconds, plan = plan_once(env, *extra)
                    assert plan["estimated"] is (kind == "estimate"), (kind, plan["size_sources"])
                    times[kind].append(seconds)
                    served[kind].append(hub.bytes_served(REPO, FILE))
                    requests[kind].append(len(hub.requests))
                shutil.rmtree(root / "cache", ignore_errors=True)
    finally:
        hub.stop()

    base = statistics.median(times["estimate"])
    print(
        f"clover-local plan on {FILE} ({size / 1e6:.1f} MB), fake Hub on 127.0.0.1, median of {args.runs} runs\n"
    )
    print(
        f"{'sizes from':<10} {'time':>8} {'vs estimate':>12} {'requests':>9} {'bytes read':>12} {'of the file':>12}"
    )
    for kind, values in times.items():
        t = statistics.median(values)
        b = int(statistics.median(served[kind]))
        r = int(statistics.median(requests[kind]))
        print(f"{kind:<10} {t:>7.2f}s {t / base:>11.2f}x {r:>9} {b:>12,} {b / size:>11.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
