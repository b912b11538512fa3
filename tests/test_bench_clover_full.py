"""``benchmarks/bench_clover_full.py`` on a tiny clover_moe GGUF through the test runtime (``scripts/make_test_runtime.py``):
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
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_clover_full.py"

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


def test_the_grid_the_busy_core_and_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--grid-quick``: grid variants measure one prompt and decoding; ``--busy``: upstream and the launch again
    beside a program that holds a core (the launch decided while it runs); ``--record``: the launch's decode
    speed kept, so the next plan of this file on this machine says it was measured."""
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.measure.records import load_records

    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--model", str(tiny_clover_model()), "--grid-quick", "--busy"]
    argv += ["--record", "--prompts", "100,300", "--decode", "16", "--turns", "1", "--json", str(out)]
    env = {**os.environ, "CLOVER_RUNTIMES_DIR": str(RUNTIMES), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    grid = [r for n, r in results.items() if not n.startswith(("upstream defaults", "clover-local"))]
    assert {"--spec-type none", "KV q8_0"} <= {r["name"] for r in grid}
    for r in grid:  # quick: the first prompt size and decoding, no agent turns
        assert r["error"] is None and set(r["prompt_speed"]) == {"100"} and r["turn_s"] == []
        assert r["decode_speed"] > 0
    busy = [n for n in results if n.endswith("beside a busy core")]
    assert busy == [
        "upstream defaults, beside a busy core",
        "clover-local (decided launch), beside a busy core",
    ]
    assert all(results[n]["error"] is None and results[n]["decode_speed"] > 0 for n in busy)
    assert all(set(results[n]["prompt_speed"]) == {"100"} for n in busy)
    records = [r for r in load_records() if r.tool == "llama-server (bench_clover_full)"]
    plain = results["--spec-type none"]  # the planner's speeds are plain decoding, as llama-bench's
    assert len(records) == 1 and records[0].tokens_per_s == round(plain["decode_speed"], 2)
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(RUNTIMES))
    # The next plan of this file with the record's threads (the threads a plan picks follow the machine's load
    # at that moment, which a test must not depend on) says its speed was measured.
    asked = LaunchRequest(None, str(tiny_clover_model()), describe=False, threads=records[0].threads)
    again = decide_launch(asked).plan
    assert records[0].threads == again.threads and again.speed_source == "measured"
    assert again.predicted_tokens_per_s == round(records[0].tokens_per_s, 1)
