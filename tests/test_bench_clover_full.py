"""``scripts/bench_clover_full.py`` on a tiny clover_moe GGUF through the test runtime (``scripts/make_test_runtime.py``):
the decided launch, upstream's defaults and a variant of the grid each started, measured and stopped, and the
report written. The full-size run is the same script on the Clover-shaped GGUF (docs/speed.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clover_local.testing.models import tiny_clover_model
from clover_local.testing.runtime import built_runtime, runtimes_folder

RUNTIMES = runtimes_folder()  # read before the per-test user directories are set
BUILT = built_runtime(RUNTIMES)
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_clover_full.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(BUILT is None, reason="the test runtime is not built (scripts/make_test_runtime.py)"),
]


def test_the_benchmark_runs_the_decided_launch_beside_upstream_defaults(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--model", str(tiny_clover_model()), "--grid", "none", "--fit-on"]
    argv += ["--prompts", "100,300", "--decode", "16", "--turns", "2", "--json", str(out)]
    env = {**os.environ, "CLOVER_RUNTIMES_DIR": str(RUNTIMES), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["runtime"] == "b99999" and report["command"].startswith(str(BUILT.server if BUILT else ""))
    names = [r["name"] for r in report["results"]]
    assert names == ["upstream defaults", "clover-local (decided launch)", "--fit on"]
    upstream, product, fit = report["results"]
    assert upstream["argv"][:2] == ["-m", str(tiny_clover_model())] and "--spec-type" not in upstream["argv"]
    assert "--spec-type" in product["argv"] and product["predicted_tokens_per_s"] > 0
    assert "--fit" in fit["argv"] and fit["argv"][fit["argv"].index("--fit") + 1] == "on"
    for r in report["results"]:
        assert r["error"] is None and r["load_s"] > 0 and r["peak_rss_bytes"] > 0
        assert set(r["prompt_speed"]) == {"100", "300"} and all(v > 0 for v in r["prompt_speed"].values())
        assert r["decode_speed"] > 0 and len(r["turn_s"][0]) == 2
    assert "upstream defaults" in done.stdout and "(x: ratio to upstream's defaults" in done.stdout
