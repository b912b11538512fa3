"""A launch is one value (``clover_local.launch``): the runner is chosen before the plan, the plan is budgeted for
that runner, the settings shown are the settings loaded, and ``--llama-server PATH`` is the binary wherever
llama-server runs. The user-visible bugs of the old seam each have a test here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers_serve import llama_server_path

from clover_local.arch_support import ArchCheck
from clover_local.detect import parse_simulate
from clover_local.engine.types import ChatMessage
from clover_local.launch import LaunchRequest, chat_template, choose_runner, decide_launch, open_launch
from clover_local.testing.models import default_spec, tiny_model, tiny_model_from_spec

MACHINE = "ram=16G,cpu=4"


def _fake_server(tmp_path: Path, name: str = "llama-server") -> Path:
    fake = tmp_path / name
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize(
    ("request_kwargs", "runner"),
    [
        ({}, "embedded"),
        ({"engine": "embedded"}, "embedded"),
        ({"engine": "llama-server"}, "llama-server"),
        ({"engine": "auto"}, "llama-server"),  # a llama-server is named, so auto takes it
        ({"spec": "off", "engine": "llama-server"}, "llama-server"),
    ],
)
def test_the_plan_is_budgeted_for_the_runner_that_runs_it(
    tmp_path: Path, request_kwargs: dict[str, str], runner: str
) -> None:
    fake = _fake_server(tmp_path)
    request = LaunchRequest(
        None, str(tiny_model("qwen35moe")), ctx=512, llama_server=str(fake), **request_kwargs
    )  # type: ignore[arg-type]
    if "engine" not in request_kwargs:
        request = dataclasses.replace(request, llama_server=None)
    launch = decide_launch(request, machine=parse_simulate(MACHINE))
    assert launch.runner.kind == runner
    assert launch.plan.engine == runner  # the memory was planned for the engine that will hold it
    if runner == "llama-server":
        assert launch.runner.binary is not None and launch.runner.binary.path == fake.resolve()
        assert launch.command.startswith(str(fake.resolve()))


def test_a_hybrid_model_holds_different_memory_per_runner(tmp_path: Path) -> None:
    """Why the order matters: the engines keep a hybrid model's recurrent state a different number of times,
    so a plan made for one engine and run on the other would be wrong."""
    fake = _fake_server(tmp_path)
    path = str(tiny_model("qwen35moe"))
    machine = parse_simulate(MACHINE)
    embedded = decide_launch(LaunchRequest(None, path, ctx=512, spec="ngram"), machine=machine)
    server = decide_launch(
        LaunchRequest(None, path, ctx=512, spec="ngram", engine="llama-server", llama_server=str(fake)),
        machine=machine,
    )
    assert embedded.plan.memory.ram.recurrent_state_bytes != server.plan.memory.ram.recurrent_state_bytes


@pytest.mark.parametrize("runtime_knows_it", [False, True])
def test_llama_server_path_is_honoured_when_the_architecture_needs_llama_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime_knows_it: bool
) -> None:
    """``serve --llama-server PATH`` with a model only a newer llama.cpp knows: PATH runs it, not the binary the
    default search finds on ``PATH`` nor the installed runtime the architecture check names (the old engine
    switch after planning used the default search). PATH is in a folder the default search never looks in."""
    on_path = _fake_server(_folder(tmp_path / "on-path"))
    runtime = _fake_server(_folder(tmp_path / "runtime" / "bin"))
    named = _fake_server(_folder(tmp_path / "mine"))
    monkeypatch.setenv("PATH", f"{on_path.parent}:/usr/bin:/bin")
    why = "only the newer llama.cpp knows it"
    only_server = ArchCheck(
        "clover_moe", True, "llama-server", why, server_path=str(runtime) if runtime_knows_it else None
    )
    default = runtime if runtime_knows_it else on_path
    # Without --llama-server the default search runs it: the file it finds is another one than PATH.
    unnamed = choose_runner(LaunchRequest(), only_server)
    assert unnamed.binary is not None and unnamed.binary.path.resolve() == default.resolve()

    runner = choose_runner(LaunchRequest(llama_server=str(named)), only_server)
    assert runner.kind == "llama-server" and runner.binary is not None
    assert runner.binary.path == named.resolve() != default.resolve()
    assert "'clover_moe'" in runner.why and str(named.resolve()) in runner.why


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_engine_embedded_with_a_model_that_needs_llama_server_is_a_clear_error() -> None:
    only_server = ArchCheck("clover_moe", True, "llama-server", "only the newer llama.cpp knows it")
    from clover_local.errors import UsageError

    with pytest.raises(UsageError, match="--engine embedded cannot run this"):
        choose_runner(LaunchRequest(engine="embedded"), only_server)


@pytest.mark.slow
def test_after_an_out_of_memory_load_the_shown_command_is_what_loaded() -> None:
    """A plan that fits on paper (a described machine with 1 TiB) but not in this machine's memory: the launch
    is planned again for less memory, and the opened engine's launch, plan and command are the re-planned ones,
    which is what loaded."""
    spec = dataclasses.replace(default_spec("llama", "f16"), n_ctx_train=2**26)
    path = tiny_model_from_spec(spec)
    request = LaunchRequest(None, str(path), ctx=2**25, threads=2, spec="off")
    launch = decide_launch(request, machine=parse_simulate("ram=1T,cpu=2"))
    assert launch.plan.ctx == 2**25 and "-c 33554432" in launch.command
    opened = open_launch(launch)
    try:
        loaded = opened.launch
        assert loaded is not launch and loaded.plan.ctx == 4096
        assert opened.engine.n_ctx == loaded.plan.ctx
        assert "-c 4096" in loaded.command and "33554432" not in loaded.command
        assert opened.fallback_message is not None and "ran out of memory" in opened.fallback_message
        assert "context 33554432 -> 4096 tokens" in opened.fallback_message
        assert opened.notices[0].code == "safer-launch" and opened.notices[0].text == opened.fallback_message
        assert [n.code for n in opened.notices].count("safer-launch") == 1
    finally:
        opened.engine.close()


@pytest.mark.usefixtures("quiet_cpu")
def test_bench_verbs_name_what_the_old_flags_did(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench`` is verbs (engines, spec-modes, verify-costs, llama-bench, show) with one default model; the older
    flags still name the same verbs."""
    from clover_local.cli import main

    assert main(["bench", "show"]) != 0
    assert "bench show needs the report's file" in capsys.readouterr().err
    model = str(tiny_model("llama"))
    assert main(["bench", "verify-costs", "--model", model, "--ctx", "512", "--json"]) == 0
    assert '"costs"' in capsys.readouterr().out


@pytest.mark.slow
def test_a_llama_server_launch_starts_with_the_argv_it_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The argv is fitted to the binary (its --help) and to this CPU's repacking rule when the launch is decided;
    opening starts exactly that, adapting nothing again."""
    model = tiny_model("llama")
    request = LaunchRequest(
        model=str(model), ctx=512, engine="llama-server", llama_server=str(llama_server_path())
    )
    launch = decide_launch(request, machine=parse_simulate(MACHINE))
    assert launch.server_argv is not None, "fitted when decided"

    def asked_again(_binary: Path) -> None:
        raise AssertionError("opening the launch asked the binary's --help again")

    monkeypatch.setattr("clover_local.llamacpp.server.capabilities", asked_again)
    opened = open_launch(launch)
    try:
        process = opened.engine.process  # type: ignore[attr-defined]
        assert process.argv[: len(launch.argv)] == launch.argv
        assert not process.warnings, "nothing left to adapt when it opened"
    finally:
        opened.engine.close()


@pytest.mark.slow
def test_a_llama_server_engine_asks_nothing_the_launch_knew(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch gives the engine its chat template and each slot's context: the engine never asks ``/props``,
    and what it says is what llama-server says (a context of 1000 is held as 1024 cells)."""
    from clover_local.llamacpp.server_engine import LlamaServerEngine

    request = LaunchRequest(
        model=str(tiny_model("llama")), ctx=1000, engine="llama-server", llama_server=str(llama_server_path())
    )
    launch = decide_launch(request, machine=parse_simulate(MACHINE))
    asked: list[str] = []
    real_get = LlamaServerEngine._get
    monkeypatch.setattr(
        LlamaServerEngine, "_get", lambda self, path: asked.append(path) or real_get(self, path)
    )
    opened = open_launch(launch)
    try:
        engine = opened.engine
        assert isinstance(engine, LlamaServerEngine)
        assert (engine.n_ctx, engine.template) == (1024, chat_template(launch))
        assert engine.tool_format in ("hermes", "qwen3_coder") and "/props" not in asked
        props = real_get(engine, "/props")
        assert props["default_generation_settings"]["n_ctx"] == engine.n_ctx
    finally:
        opened.engine.close()


@pytest.mark.slow
def test_opening_reads_no_header_the_facts_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chat template comes from the header the launch's facts read: opening reads no header again."""
    launch = decide_launch(
        LaunchRequest(model=str(tiny_model("llama")), ctx=512), machine=parse_simulate(MACHINE)
    )

    def read_again(path: Path) -> None:
        raise AssertionError(f"opening the launch read {path.name}'s header again")

    monkeypatch.setattr("clover_local.gguf.header.header_of", read_again)
    opened = open_launch(launch, measure_costs=False)
    try:
        assert opened.engine.render_prompt((ChatMessage("user", "hi"),)) == (
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        )
    finally:
        opened.engine.close()
