"""One repacking rule for every llama.cpp process (``engine.repack``): where this CPU must not repack weights
(AMX on the pinned llama.cpp crashes in llama_decode), llama-server, llama-diffusion-cli, llama-fit-params and
llama-bench are told so in their own spelling, whatever machine the plan described, and the real binaries
accept it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_local.engine import repack
from clover_local.measure.llama_bench import parse_llama_bench_json
from tests.helpers_serve import llama_server_path


@pytest.fixture
def must_not_repack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(repack, "repack_safe_here", lambda: False)
    yield


def test_flags_are_added_once_and_only_where_the_cpu_needs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repack, "repack_safe_here", lambda: True)
    assert repack.common_argv_here(["llama-server", "-m", "m"]) == ["llama-server", "-m", "m"]
    assert repack.bench_argv_here(["llama-bench"]) == ["llama-bench"]
    monkeypatch.setattr(repack, "repack_safe_here", lambda: False)
    assert repack.common_argv_here(["x"]) == ["x", "--no-repack"]
    assert repack.common_argv_here(["x", "-nr"]) == ["x", "-nr"]
    assert repack.bench_argv_here(["llama-bench"]) == ["llama-bench", "--repack", "0"]
    assert repack.bench_argv_here(["llama-bench", "--repack", "1"]) == ["llama-bench", "--repack", "1"]


def test_real_llama_bench_takes_the_flag(must_not_repack: None, tiny_models: dict[str, Path]) -> None:
    bench = llama_server_path().with_name("llama-bench")
    argv = [
        str(bench),
        "-m",
        str(tiny_models["llama"]),
        "-t",
        "1",
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "-o",
        "json",
    ]
    done = subprocess.run(
        repack.bench_argv_here(argv), capture_output=True, text=True, timeout=300, check=True
    )
    assert parse_llama_bench_json(done.stdout) > 0


def test_real_diffusion_cli_takes_the_flag(must_not_repack: None) -> None:
    from clover_local.testing.models import tiny_model
    from tests.diffusion_cli import CliOutputLost, run_cli

    cli = llama_server_path().with_name("llama-diffusion-cli")
    cmd = [str(cli), "-m", str(tiny_model("dream")), "-p", "Hi", "-ub", "64", "-b", "64", "-c", "64"]
    cmd += ["-t", "1", "--temp", "0", "--seed", "1", "--diffusion-steps", "4", "--diffusion-eps", "0.001"]
    try:
        run = run_cli(cmd)
    except CliOutputLost as exc:
        pytest.skip(f"{exc} (its logger's last lines race its exit)")
    assert run.seconds > 0


@pytest.mark.parametrize(("ram", "repacks"), [("24G", False), ("128G", True)])
def test_a_plan_repacks_only_where_ram_holds_the_copy_beside_the_files_pages(ram: str, repacks: bool) -> None:
    """Clover's 21 GiB of weights on a CPU: a 24 GB machine cannot hold a repacked copy beside the file's pages
    (measured there: repacking made loads 5x and prompts 1.6x slower, docs/speed.md), a 128 GB one can; a plan
    on a GPU reads few weights from RAM and repacks them."""
    from clover_local.detect import parse_simulate
    from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
    from clover_local.plan.planner import make_plan
    from clover_local.plan.reasons import find_reason
    from clover_local.plan.types import Wishes
    from clover_local.presets import load_preset

    preset = load_preset("clover-35b-a3b")
    plan = make_plan(
        parse_simulate(f"ram={ram},cpu=8"), preset, None, Wishes(engine="llama-server", ctx=4096)
    )
    assert plan.repack is repacks
    assert ("--no-repack" in llama_server_args(plan)) is not repacks
    assert llama_cpp_kwargs(plan).get("use_extra_bufts", True) is repacks
    said = find_reason(plan.reasons, "repack")
    assert (said is None) is repacks and (said is None or "beside the file's pages" in said.text)
    gpu = make_plan(
        parse_simulate("ram=24G,cpu=8,gpu=nvidia:24G"), preset, None, Wishes(engine="llama-server")
    )
    assert gpu.repack and "--no-repack" not in llama_server_args(gpu)
