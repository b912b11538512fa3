"""llama-server's threads bound one to a core while they take every core (``plan.threads.bound``): the cores
read from the kernel's topology (one CPU per physical core this process may use), the flags in the plan's argv
and in a relaunch's (``with_threads``), and the pinned llama-server applying them (its threads' CPU sets read
from ``/proc``)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from helpers_serve import llama_server_path

from clover_local.detect import parse_simulate
from clover_local.detect.cpu import core_cpus
from clover_local.llamacpp.binary import ServerBinary
from clover_local.llamacpp.server_args import threads_in, with_threads
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.threads import binding_flags, bound, cores_in_mask, cpu_mask, plan_threads
from clover_local.plan.types import Wishes
from clover_local.presets import load_preset


def _sysfs(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, listed in siblings.items():
        topology = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(listed + "\n")
    return root


# Two cores with two hardware threads each, numbered as Linux numbers most x86 machines (siblings N apart), and
# as it numbers some others (siblings adjacent).
APART = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}
ADJACENT = {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}


@pytest.mark.parametrize(
    ("siblings", "allowed", "cores"),
    [
        (APART, {0, 1, 2, 3}, (0, 1)),
        (ADJACENT, {0, 1, 2, 3}, (0, 2)),
        (APART, {2, 3}, (2, 3)),  # a container's CPU set: its own CPUs, one per core
        (ADJACENT, {1, 3}, (1, 3)),
        ({0: "0", 1: "1"}, {0, 1}, (0, 1)),  # no SMT
    ],
)
def test_one_cpu_per_core_among_the_allowed(
    tmp_path: Path, siblings: dict[int, str], allowed: set[int], cores: tuple[int, ...]
) -> None:
    assert core_cpus(_sysfs(tmp_path, siblings), allowed) == cores


def test_an_unreadable_topology_binds_nothing(tmp_path: Path) -> None:
    assert core_cpus(_sysfs(tmp_path, {0: "0"}), {0, 1}) == ()  # cpu1 has no topology
    assert core_cpus(_sysfs(tmp_path / "odd", {0: "zero"}), {0}) == ()


def test_the_mask_is_llama_cpps_hex_and_reads_back() -> None:
    assert cpu_mask((0, 1)) == "3" and cpu_mask((2, 3)) == "c" and cpu_mask((0, 8)) == "101"
    for cores in [(0,), (0, 1), (1, 3, 64)]:
        assert cores_in_mask(cpu_mask(cores)) == cores
    assert cores_in_mask("0x3") == (0, 1) and cores_in_mask("not hex") == ()


@pytest.mark.parametrize(
    ("threads", "cores", "strict"),
    [(2, (0, 1), "1"), (1, (0, 1), "0"), (4, (0, 2, 4, 6), "1"), (3, (0, 2, 4, 6), "0")],
)
def test_bound_only_while_the_threads_take_every_core(
    threads: int, cores: tuple[int, ...], strict: str
) -> None:
    flags = binding_flags(threads, cores)
    mask = cpu_mask(cores)
    assert flags == ["-C", mask, "--cpu-strict", strict, "-Cb", mask, "--cpu-strict-batch", strict]
    assert bound(threads, cores) is (strict == "1")
    assert binding_flags(threads, ()) == []


def test_a_relaunch_binds_again_only_with_every_core() -> None:
    argv = ["-m", "m.gguf", "-t", "2", "-tb", "2", *binding_flags(2, (0, 1)), "--port", "1"]
    fewer = with_threads(argv, 1)
    assert threads_in(fewer) == 1
    assert fewer[fewer.index("--cpu-strict") + 1] == "0" and fewer[fewer.index("-C") + 1] == "3"
    assert fewer.count("-C") == 1 and fewer.count("--cpu-strict-batch") == 1
    again = with_threads(fewer, 2)
    assert (
        again[again.index("--cpu-strict") + 1] == "1" and again[again.index("--cpu-strict-batch") + 1] == "1"
    )
    plain = with_threads(["-m", "m.gguf", "-t", "2"], 1)
    assert plain == ["-m", "m.gguf", "-t", "1", "-tb", "1"]  # no mask: nothing bound, nothing added


def test_the_plan_binds_llama_servers_threads_and_says_so() -> None:
    preset = load_preset("gemma3-270m")
    machine = parse_simulate("ram=16G,cpu=2")
    machine = replace(machine, cpu=replace(machine.cpu, core_cpus=(0, 1)))
    server = make_plan(machine, preset, None, Wishes(ctx=2048, engine="llama-server"))
    argv = llama_server_args(server)
    assert argv[argv.index("-C") + 1] == "3" and argv[argv.index("--cpu-strict") + 1] == "1"
    why = next(r.text for r in server.reasons if r.code == "threads")
    assert "bound one to a core" in why
    busy = replace(machine, cpu=replace(machine.cpu, others_busy_cores=1.0))
    shared = make_plan(busy, preset, None, Wishes(ctx=2048, engine="llama-server"))
    argv = llama_server_args(shared)
    assert argv[argv.index("-t") + 1] == "1" and argv[argv.index("--cpu-strict") + 1] == "0"
    assert "bound one to a core" not in next(r.text for r in shared.reasons if r.code == "threads")
    # The embedded engine has no such setting; a described machine's topology is not known
    embedded = make_plan(machine, preset, None, Wishes(ctx=2048))
    assert "-C" not in llama_server_args(embedded) and embedded.core_cpus == ()
    assert "cpu_mask" not in llama_cpp_kwargs(embedded)
    described = make_plan(
        parse_simulate("ram=16G,cpu=2"), preset, None, Wishes(ctx=2048, engine="llama-server")
    )
    assert "-C" not in llama_server_args(described)


def test_threads_asked_for_are_bound_when_they_take_every_core() -> None:
    assert "bound one to a core" in plan_threads(2, 2, 2, engine="llama-server", core_cpus=(0, 1)).reason
    assert "bound" not in plan_threads(2, 2, 1, engine="llama-server", core_cpus=(0, 1)).reason


@pytest.fixture(scope="module")
def server_binary() -> ServerBinary:
    """The pinned llama-server (resolved before a test's own data folder replaces the user's)."""
    return ServerBinary(llama_server_path(), "test")


@pytest.mark.slow
def test_the_pinned_llama_server_runs_each_thread_on_its_own_core(
    smollm2_path: Path, server_binary: ServerBinary
) -> None:
    """The flags are real: llama-server started with the plan's binding keeps one compute thread on each core
    (its threads' CPU sets, read from /proc after a reply); started again with fewer threads, none is held to
    one core."""

    from clover_local.engine.types import Finished, GenerationRequest
    from clover_local.llamacpp.server import start_llama_server
    from clover_local.llamacpp.server_engine import LlamaServerEngine

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing to bind apart")
    cores = (allowed[0], allowed[1])
    argv = ["-m", str(smollm2_path), "-c", "512", "-np", "1", "-t", "2", "-tb", "2", *binding_flags(2, cores)]
    process = start_llama_server(argv, binary=server_binary, keep_slots=True)
    engine = LlamaServerEngine(process, model_name="m", slots=1)
    try:

        def single_cpu_threads() -> set[int]:
            for event in engine.generate(GenerationRequest(prompt="Hello", max_tokens=4, temperature=0.0)):
                if isinstance(event, Finished):
                    break
            held = set()
            assert process.pid is not None
            for task in Path(f"/proc/{process.pid}/task").iterdir():
                line = next(
                    x for x in (task / "status").read_text().splitlines() if x.startswith("Cpus_allowed_list")
                )
                listed = line.split(":", 1)[1].strip()
                if listed.isdigit():
                    held.add(int(listed))
            return held

        assert single_cpu_threads() == set(cores)  # a thread on each core, none elsewhere
        process.relaunch(with_threads(process.argv, 1), 120.0)
        assert single_cpu_threads() == set()  # one thread, free to move to the core other programs leave
    finally:
        engine.close()
        process.stop()


def test_detection_reads_the_cores_this_process_may_use(tmp_path: Path) -> None:
    from clover_local.detect.probe import ProbeInputs, detect_machine

    cpuinfo = Path(__file__).parent / "data" / "detect" / "cpuinfo_amd_epyc_x86_64.txt"
    inputs = ProbeInputs(
        system="linux", sysfs_root=_sysfs(tmp_path, APART), cpuinfo=cpuinfo, allowed_cpus=lambda: {1, 2, 3}
    )
    assert detect_machine(tmp_path, inputs).cpu.core_cpus == (
        1,
        2,
    )  # core 0 through cpu2, core 1 through cpu1
