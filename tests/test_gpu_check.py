"""The GPU check's pure parts (CI has no GPU): llama-bench argv and output parsing, the planned-vs-real table,
speed records; and the library-load-order guard, which runs everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clover_local.detect import parse_simulate
from clover_local.engine.repack import bench_argv_here
from clover_local.measure.gpu_check import CaseReport, EngineMeasure, format_reports
from clover_local.measure.llama_bench import Placement, llama_bench_argv, parse_llama_bench_json
from clover_local.measure.records import add_record, load_records, records_path
from clover_local.plan.measured import SpeedRecord
from clover_local.plan.planner import make_plan
from clover_local.plan.types import Plan, Wishes
from clover_local.presets import load_preset
from tests.helpers_serve import llama_server_path

GIB = 1024**3
REPO = Path(__file__).resolve().parent.parent


def test_llama_bench_argv_follows_the_plan() -> None:
    plan = make_plan(
        parse_simulate("gpu=nvidia:12G,ram=64G,cpu=16"), load_preset("clover-35b-a3b"), None, Wishes()
    )
    argv = llama_bench_argv(Path("llama-bench"), Path("m.gguf"), Placement.of(plan), n_gen=64)
    assert argv[argv.index("-ngl") + 1] == "999"
    assert argv[argv.index("-ncmoe") + 1] == str(plan.n_cpu_moe) and plan.n_cpu_moe > 0
    assert argv[argv.index("-t") + 1] == str(plan.threads)
    assert argv[argv.index("-n") + 1] == "64" and argv[argv.index("-p") + 1] == "0"


def test_llama_bench_json_gives_the_decode_rate() -> None:
    out = 'log line\n[{"n_prompt": 0, "n_gen": 128, "avg_ts": 250.5}]\n'
    assert parse_llama_bench_json(out) == 250.5
    with pytest.raises(ValueError, match="no decode"):
        parse_llama_bench_json('[{"n_prompt": 512, "n_gen": 0, "avg_ts": 9000.0}]')


def test_real_llama_bench_on_gemma_is_parsed(gemma_path: Path) -> None:
    """The real built llama-bench: its JSON is what the parser reads."""

    bench = llama_server_path().with_name("llama-bench")
    argv = [str(bench), "-m", str(gemma_path), "-t", "1", "-p", "0", "-n", "8", "-r", "1", "-o", "json"]
    done = subprocess.run(
        bench_argv_here(argv),  # repacking as this CPU allows (engine.repack)
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert parse_llama_bench_json(done.stdout) > 0


def test_report_table_puts_planned_next_to_real() -> None:
    case = CaseReport(
        name="12 GiB free",
        free_bytes=12 * GIB,
        ctx=16384,
        n_gpu_layers=-1,
        n_cpu_moe=22,
        planned_gpu_bytes=int(10.9 * GIB),
        planned_breakdown={},
        predicted_tokens_per_s=96.0,
        speed_source="estimate",
        llama_bench=EngineMeasure(decode_tokens_per_s=95.0),
        llama_server=EngineMeasure(),
        embedded=EngineMeasure(decode_tokens_per_s=93.1, peak_gpu_bytes=int(10.4 * GIB)),
    )
    table = format_reports([case])
    row = table.splitlines()[-1]
    assert "--n-cpu-moe 22" in row and "10.90 GiB" in row and "0.954" in row and "0.98" in row


def test_speed_records_survive_damage_and_append(tmp_path: Path) -> None:
    path = tmp_path / "records.json"
    path.write_text("{not json")
    assert load_records(path) == []
    rec = SpeedRecord("m", "Q4_K_M:1", -1, 0, 250.0, 1500.0)
    add_record(rec, path)
    add_record(SpeedRecord("m", "Q4_K_M:1", -1, 5, 147.0, 300.0), path)
    assert [r.n_cpu_moe for r in load_records(path)] == [0, 5]
    path.write_text(json.dumps([{"machine": "m"}, 3, {"nonsense": 1}]))
    assert load_records(path) == []
    assert records_path().name == "speed-records.json"


def test_check_gpu_script_rejects_a_bad_free_list() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "check_gpu.py"), "--model", "x.gguf", "--free", "lots"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "'lots' is not a size like 12G" in done.stderr


def test_clover_local_loads_libllama_before_numpy() -> None:
    """The guard for issue 10's CUDA crash: importing clover_local maps libllama into the process without
    importing numpy, so whatever is imported next, llama.cpp's libraries came first."""
    code = (
        "import sys, clover_local, clover_local._native as n\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('numpy' in sys.modules, 'libllama' in maps, n.loaded_path is not None, n.numpy_was_first)\n"
    )
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/maps")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "True", "False"]


def test_a_model_loads_with_numpy_imported_first(gemma_path: Path) -> None:
    """The order that crashed the CUDA build: numpy, then the engine. Here it must load and generate."""
    code = (
        "import numpy\n"
        "from clover_local.engine.loader import load_engine\n"
        "from clover_local.engine.types import GenerationRequest, TextDelta\n"
        "from clover_local.testing.settings import engine_settings\n"
        f"r = load_engine({str(gemma_path)!r}, engine_settings({str(gemma_path)!r}, ctx=512, threads=1),"
        " chat_template='completion')\n"
        "req = GenerationRequest(prompt='The capital of France is', max_tokens=4, temperature=0)\n"
        "print(''.join(e.text for e in r.engine.generate(req) if isinstance(e, TextDelta)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()


def test_doctor_measure_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    from clover_local.cli import main

    assert main(["doctor", "--measure", "--free", "lots"]) != 0
    assert "'lots' is not a size like 12G" in capsys.readouterr().err
    if not any(
        g.vendor == "nvidia" for g in __import__("clover_local.model_files").model_files.detect().gpus
    ):
        assert main(["doctor", "--measure"]) != 0
        assert "needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_records_llama_bench_and_plans_then_use_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gemma_path: Path
) -> None:
    """`bench --llama-bench` measures the plan's placement with the real llama-bench and records it; the next
    plan on this machine shows the measurement instead of the estimate. `--vs-llama-bench` reports engine (b)
    against llama-bench with the same settings."""
    from clover_local.cli import main
    from clover_local.launch import LaunchRequest, decide_launch

    def plan_for(preset: str) -> Plan:
        return decide_launch(LaunchRequest(preset)).plan

    monkeypatch.setenv("CLOVER_LLAMA_SERVER", str(llama_server_path()))
    assert plan_for("gemma3-270m").speed_source == "estimate"
    assert main(["bench", "--llama-bench", "--preset", "gemma3-270m", "--max-tokens", "8"]) == 0
    assert "Recorded in" in capsys.readouterr().out
    (record,) = load_records()
    plan = plan_for("gemma3-270m")
    assert plan.speed_source == "measured" and record.tokens_per_s > 0 and record.threads == plan.threads
    # The plan shows the measurement as it shows every speed, to 0.1 token/s (29.75 measured -> 29.8).
    assert plan.predicted_tokens_per_s == round(record.tokens_per_s, 1)

    args = ["bench", "--engines", "b", "--workloads", "summary", "--rounds", "1", "--max-tokens", "8"]
    assert main([*args, "--vs-llama-bench", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["llama_bench"]["decode_tokens_per_s"] > 0 and report["llama_bench"]["n_gen"] == 8


def test_run_model_file_is_planned_for_this_machines_gpu(
    monkeypatch: pytest.MonkeyPatch, gemma_path: Path
) -> None:
    """`run --model FILE` plans like a preset's file: on a machine with a GPU, layers go to the GPU (it used to
    load every file on the CPU with a 4K context)."""
    import argparse

    from clover_local import launch, model_files
    from clover_local.commands import run as run_command

    seen = {}

    def capture(decided, *args, **kwargs):
        seen["plan"] = decided.plan
        raise SystemExit(0)

    monkeypatch.setattr(model_files, "detect", lambda *a, **k: parse_simulate("gpu=nvidia:12G,ram=32G"))
    monkeypatch.setattr(launch, "open_launch", capture)
    parser = argparse.ArgumentParser()
    run_command.register(parser.add_subparsers())
    args = parser.parse_args(["run", "--model", str(gemma_path), "--prompt", "hi"])
    with pytest.raises(SystemExit):
        run_command._open(args)
    plan = seen["plan"]
    assert plan.n_gpu_layers == -1 and plan.backend == "cuda" and plan.model_path == str(gemma_path)
    assert plan.ctx > 4096  # the file's own context limit (32768), planned, not a fixed 4K
