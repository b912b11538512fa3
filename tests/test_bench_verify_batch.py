"""benchmarks/bench_verify_batch.py runs on a real model and reports a consistent ceiling (no timing is asserted:
only that each row's numbers agree with each other)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_verify_batch.py"


def test_reports_batch_cost_and_ceiling_per_draft_length() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "1", "--json"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["threads"] == 1 and report["step_ms"] > 0
    assert [r["drafted"] for r in report["batches"]] == [1, 2, 4, 8, 16]
    for row in report["batches"]:
        assert row["batch_ms"] > 0
        assert row["batch_in_steps"] == pytest.approx(row["batch_ms"] / report["step_ms"], rel=0.01)
        assert row["ceiling"] == pytest.approx((row["drafted"] + 1) / row["batch_in_steps"], rel=0.01)
