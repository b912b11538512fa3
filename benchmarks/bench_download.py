#!/usr/bin/env python3
"""Throughput of ``clover-local download`` against a plain ``hf_hub_download`` of the same file, from the
same local fake Hub (``tests/hub_server.py`` on 127.0.0.1), side by side.

Each run is a fresh process with an empty Hugging Face cache; the two tools alternate, three runs each,
and the medians are compared. clover-local's time includes its sha256 check (done while the bytes
arrive) and its resumable bookkeeping; ``hf_hub_download`` over plain HTTP checks only the size.

    .venv/bin/python benchmarks/bench_download.py            # 200 MB, 3 runs each
    .venv/bin/python benchmarks/bench_download.py --mb 50 --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hub_server import HubServer  # noqa: E402

REPO = "bench/Bench-GGUF"
FILE = "Bench-Q8_0.gguf"

HF_SNIPPET = (
    "import sys; from huggingface_hub import hf_hub_download; "
    "print(hf_hub_download(sys.argv[1], sys.argv[2]))"
)


def timed_run(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed:\n{done.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=200, help="file size in MB (default 200)")
    parser.add_argument("--runs", type=int, default=3, help="runs per tool (default 3)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-download-") as tmp_name:
        tmp = Path(tmp_name)
        source = tmp / FILE
        with source.open("wb") as f:
            f.write(b"GGUF")
            for _ in range(args.mb):
                f.write(os.urandom(1_000_000))
        size = source.stat().st_size
        hub = HubServer().start()
        hub.add_file(REPO, FILE, source)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CLOVER_"))}
        base_env |= {
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        tools = {
            "clover-local download": [
                sys.executable,
                "-m",
                "clover_local",
                "download",
                "--repo",
                REPO,
                "--quant",
                "Q8_0",
            ],
            "hf_hub_download": [sys.executable, "-c", HF_SNIPPET, REPO, FILE],
        }
        times: dict[str, list[float]] = {name: [] for name in tools}
        try:
            for run in range(args.runs):
                for name, argv in tools.items():
                    home = tmp / f"hf-{run}-{name.split()[0]}"
                    env = base_env | {"HF_HOME": str(home), "CLOVER_CONFIG_DIR": str(tmp / "cfg")}
                    times[name].append(timed_run(argv, env))
                    subprocess.run(["rm", "-rf", str(home)], check=True)
        finally:
            hub.stop()

    print(
        f"file: {size / 1e6:.0f} MB from a local fake Hub; {args.runs} runs each, fresh process and cache per run"
    )
    medians = {}
    for name, samples in times.items():
        medians[name] = statistics.median(samples)
        runs = ", ".join(f"{t:.2f}" for t in samples)
        print(
            f"  {name:<22} median {medians[name]:6.2f} s  ({size / 1e6 / medians[name]:6.1f} MB/s)  runs: {runs}"
        )
    ratio = medians["hf_hub_download"] / medians["clover-local download"]
    print(f"throughput ratio clover-local / hf_hub_download: {ratio:.2f}x (median of {args.runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
