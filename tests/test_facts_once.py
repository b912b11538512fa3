"""Facts once, then one pure decision (issue 42): every file, process and Hub request a launch depends on is made
in ``facts.gather_facts``; ``decide.decide`` reads none, so it runs here with files, sockets and processes barred
and gives the same launch; and a ``plan``, a ``serve`` and a ``chat`` each read a model's header once and check
its architecture once."""

from __future__ import annotations

import argparse
import builtins
import io
import os
import shutil
import socket
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_runner import BUILT, RUNTIMES

from clover_local import arch_support
from clover_local.decide import decide
from clover_local.facts import gather_facts, still_true_for
from clover_local.gguf import header
from clover_local.launch import LaunchRequest, decide_launch
from clover_local.llamacpp.server_args import fit_argv
from clover_local.testing.models import tiny_clover_model


class Barred(AssertionError):
    """I/O inside the pure decision."""


def _barred(what: str) -> Callable[..., Any]:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise Barred(f"decide did I/O: {what}{args[:2]!r}")

    return refuse


@pytest.fixture
def io_barred(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Files, sockets and processes refused for the test's body (the fixture undoes it before teardown)."""
    with monkeypatch.context() as barred:
        barred.setattr(builtins, "open", _barred("open"))
        barred.setattr(io, "open", _barred("io.open"))
        barred.setattr(os, "open", _barred("os.open"))
        barred.setattr(os, "listdir", _barred("os.listdir"))
        barred.setattr(os, "scandir", _barred("os.scandir"))
        barred.setattr(socket.socket, "connect", _barred("socket.connect"))
        barred.setattr(socket, "create_connection", _barred("socket.create_connection"))
        barred.setattr(subprocess.Popen, "__init__", _barred("subprocess"))
        yield


def _requests(smollm2: Path, tmp_path: Path) -> dict[str, LaunchRequest]:
    model = tmp_path / "SmolLM2-135M-Instruct-Q4_1.gguf"
    shutil.copyfile(smollm2, model)
    return {
        "a preset, its quants described": LaunchRequest("smollm2-135m", ctx=1024),
        "a local file": LaunchRequest(None, str(model), ctx=2048, parallel=None),
        "Clover, offline, on a described GPU machine": LaunchRequest(
            "clover-35b-a3b", offline=True, simulate="gpu=nvidia:24G,ram=64G,cpu=16"
        ),
        "Clover's estimates, a described CPU machine": LaunchRequest(
            "clover-35b-a3b", describe=False, offline=True, simulate="ram=48G,cpu=8"
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "a preset, its quants described",
        "a local file",
        "Clover, offline, on a described GPU machine",
        "Clover's estimates, a described CPU machine",
    ],
)
def test_decide_reads_no_file_socket_or_process(
    case: str, smollm2_path: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    asked = _requests(smollm2_path, tmp_path)[case]
    facts = gather_facts(asked)
    expected = decide(asked, facts)  # also imports what decide imports lazily
    request.getfixturevalue("io_barred")
    again = decide(asked, facts)
    assert again == expected
    with pytest.raises(Barred):  # not vacuous: the bar holds
        Path(facts.preset.source or __file__).read_bytes()


def test_clover_through_its_runtime_is_decided_without_io(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The path a Clover user takes: a ``clover_moe`` file run by the installed runtime's llama-server, its argv
    fitted to that binary's ``--help``, which the facts hold."""
    if BUILT is None:
        pytest.skip("the test runtime is not built (scripts/make_test_runtime.py)")
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(RUNTIMES))
    model = tmp_path / "tiny-clover.gguf"
    shutil.copyfile(tiny_clover_model(), model)
    asked = LaunchRequest(None, str(model), ctx=512, describe=False)
    facts = gather_facts(asked)
    expected = decide(asked, facts)
    assert expected.runner.kind == "llama-server" and expected.runner.runtime is not None
    assert expected.server_argv is not None  # fitted from the facts, not when started
    # ... by the one fitting start_llama_server uses for a binary not asked before
    assert expected.runner.binary is not None
    caps = facts.servers[str(expected.runner.binary.path)].capabilities
    assert caps is not None
    fitted = fit_argv(expected.settings.argv(), caps, repack_safe=facts.repack_safe_here)
    assert tuple(fitted.argv) == expected.server_argv
    request.getfixturevalue("io_barred")
    assert decide(asked, facts) == expected


def test_facts_answer_for_a_later_step_of_the_same_command(smollm2_path: Path) -> None:
    """Another context or speculation mode is decided from the same facts; another file is not."""
    asked = LaunchRequest(None, str(smollm2_path), ctx=1024)
    facts = gather_facts(asked)
    assert still_true_for(facts, LaunchRequest("smollm2-135m", str(smollm2_path), ctx=4096, spec="off"))
    assert not still_true_for(facts, LaunchRequest(None, str(smollm2_path) + ".other.gguf"))
    assert not still_true_for(facts, LaunchRequest("gemma3-270m", str(smollm2_path)))


# -- one header read and one architecture check per quant per command ------------------------------------------


class Reads:
    """Counts of the header reads (per file) and architecture checks (per architecture) a command makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.headers: Counter[str] = Counter()
        self.checks: Counter[str] = Counter()
        self.tables = 0
        real_read, real_check, real_support = (
            header.read_local_header,
            arch_support.check_architecture,
            arch_support.installed_support,
        )

        def read(path: Path) -> Any:
            self.headers[Path(path).name] += 1
            return real_read(path)

        def check(arch: str, support: Any = None) -> Any:
            self.checks[arch] += 1
            return real_check(arch, support)

        def tables(*args: Any, **kwargs: Any) -> Any:
            self.tables += 1
            return real_support(*args, **kwargs)

        header._header_of.cache_clear()  # a header another test read is read again here
        monkeypatch.setattr(header, "read_local_header", read)
        monkeypatch.setattr(arch_support, "check_architecture", check)
        monkeypatch.setattr(arch_support, "installed_support", tables)

    def assert_once(self, *files: str) -> None:
        for name in files:
            assert self.headers[name] == 1, f"{name}: read {self.headers[name]} times"
        assert self.checks and all(n == 1 for n in self.checks.values()), self.checks
        assert self.tables == 1, f"the architecture tables were read {self.tables} times"


def _main(*argv: str) -> int:
    from clover_local.cli import main

    return main(list(argv))


def test_plan_reads_each_header_once(
    monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reads = Reads(monkeypatch)
    assert _main("plan", "--preset", "smollm2-135m", "--offline") == 0
    assert "smollm2" in capsys.readouterr().out.lower()
    reads.assert_once(smollm2_path.name)


def test_plan_of_a_file_reads_it_once(
    monkeypatch: pytest.MonkeyPatch, tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    reads = Reads(monkeypatch)
    model = tiny_models["qwen35moe"]
    assert _main("plan", "--model", str(model)) == 0
    capsys.readouterr()
    reads.assert_once(model.name)


def test_serve_reads_the_header_once_up_to_serving(
    monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve`` of the demo preset, through opening the real engine, to the moment it would listen."""
    from clover_local.serve import runner

    served: list[int] = []
    monkeypatch.setattr(runner, "serve_forever", lambda engine, *a, **k: served.append(engine.n_ctx))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reads = Reads(monkeypatch)
    assert _main("serve", "--preset", "smollm2-135m", "--ctx", "512", "--port", "8999") == 0
    capsys.readouterr()
    assert served == [512]
    reads.assert_once(smollm2_path.name)


def test_chat_reads_the_header_once_before_and_inside_the_app(
    monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp_path: Path
) -> None:
    """``chat FILE``: the architecture and ``--ctx`` are checked before the app starts, from facts the app's
    launch then uses (the launch screen's ``services.launch_for``), so nothing is read twice."""
    from clover_local.cli import build_parser
    from clover_local.commands.chat import start_options
    from clover_local.presets import load_preset
    from clover_local.tui import services
    from clover_local.user_prefs import ModelSettings

    model = tmp_path / "SmolLM2-135M-Instruct-Q4_1.gguf"
    shutil.copyfile(smollm2_path, model)
    reads = Reads(monkeypatch)
    args = build_parser().parse_args(["chat", str(model), "--ctx", "1024"])
    assert isinstance(args, argparse.Namespace)
    options = start_options(args)
    assert options.facts is not None
    launch = services.launch_for(
        load_preset("smollm2-135m"), str(model), ModelSettings(ctx=1024), facts=options.facts
    )
    assert launch.plan.model_path == str(model) and launch.plan.ctx == 1024
    reads.assert_once(model.name)


def test_the_counter_sees_a_second_gathering(monkeypatch: pytest.MonkeyPatch, smollm2_path: Path) -> None:
    """Not vacuous: two launches gathered apart check the architecture twice."""
    reads = Reads(monkeypatch)
    decide_launch(LaunchRequest(None, str(smollm2_path), ctx=1024))
    decide_launch(LaunchRequest(None, str(smollm2_path), ctx=2048))
    assert reads.tables == 2 and sum(reads.checks.values()) == 2
    assert reads.headers[smollm2_path.name] == 1  # the header itself is read once per file version


async def test_the_plan_screen_reads_again_only_when_what_it_read_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The app's plan screen: another context is decided from the facts it has (nothing read, on the UI thread);
    sizes arriving, community quants, or a runtime installed, read again (by a worker)."""
    from textual.widgets import Select
    from waiting import wait_until

    from clover_local.detect import parse_simulate
    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen

    reads = Reads(monkeypatch)
    app = CloverApp(
        StartOptions(preset="clover-35b-a3b"), machine=parse_simulate("ram=64G,gpu=nvidia:24G,cpu=16")
    )
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.plan is not None, "the first plan", pilot=pilot)
        assert screen.facts is not None  # a described machine: the preset's sizes, read with the first plan
        read = reads.tables
        for ctx in (8192, 4096, 16384):
            screen.query_one("#ctx", Select).value = ctx
            await wait_until(
                lambda c=ctx: screen.plan is not None and screen.plan.ctx == c, "re-plan", pilot=pilot
            )
        assert reads.tables == read, "a context changed: nothing read again"
        shown = screen.plan_count
        screen.read_again()  # as after a runtime is installed: read again by a worker, then planned
        await wait_until(lambda: screen.plan_count > shown, "the plan from facts read again", pilot=pilot)
        assert reads.tables == read + 1


# -- one owner of a launch (issue 50): one gathering, one decision, nothing read on the app's UI thread ---------


def test_only_the_launcher_gathers_facts_and_decides() -> None:
    """``facts.gather_facts``, ``facts.gather_community`` and ``decide.decide`` are called from
    ``launcher.py`` alone: every front end asks a :class:`~clover_local.launcher.Launcher`, so no front end
    gathers or decides beside it."""
    import ast

    import clover_local

    owners = {"gather_facts", "gather_community", "decide"}
    found: list[str] = []
    for path in Path(clover_local.__file__).parent.rglob("*.py"):
        if path.name == "launcher.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else None
            by_module = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            if by_module and func.value.id in ("facts", "decide"):  # type: ignore[attr-defined]
                called = func.attr  # type: ignore[attr-defined]
            if called in owners:
                found.append(f"{path.name}:{node.lineno} {called}")
    assert not found, f"gathered or decided outside the launcher: {found}"


class Launches:
    """Counts the launcher's gatherings and decisions, and the threads that read headers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        from clover_local import launcher

        self.gathered = 0
        self.decided = 0
        self.header_threads: list[str] = []
        real_gather, real_decide, real_read = launcher.gather_facts, launcher.decide, header.read_local_header

        def gather(*args: Any, **kwargs: Any) -> Any:
            self.gathered += 1
            return real_gather(*args, **kwargs)

        def decide_(*args: Any, **kwargs: Any) -> Any:
            self.decided += 1
            return real_decide(*args, **kwargs)

        def read(path: Path) -> Any:
            self.header_threads.append(threading.current_thread().name)
            return real_read(path)

        header._header_of.cache_clear()
        monkeypatch.setattr(launcher, "gather_facts", gather)
        monkeypatch.setattr(launcher, "decide", decide_)
        monkeypatch.setattr(header, "read_local_header", read)


def _clover_on_disk(hub_server: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Clover preset's Q4_K_M file in the Hugging Face cache (a tiny ``clover_moe`` model under its name),
    found offline as a person's download is, run by the test runtime's llama-server (skipped when it is not built)."""
    from huggingface_hub import hf_hub_download

    if BUILT is None:
        pytest.skip("the test runtime is not built (scripts/make_test_runtime.py)")
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(RUNTIMES))

    repo, name = "Diffuspace/Clover-35B-A3B-Preview-GGUF", "Clover-35B-A3B-Preview-Q4_K_M.gguf"
    hub_server.add_file(repo, name, tiny_clover_model())
    path = Path(hf_hub_download(repo, name))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return path


@pytest.mark.slow
async def test_a_chat_of_the_clover_preset_on_disk_gathers_and_decides_once(
    monkeypatch: pytest.MonkeyPatch, hub_server: Any
) -> None:
    """``chat clover-35b-a3b`` with its file downloaded, through the real app to the chat screen (its runtime's
    llama-server loaded): one gathering of facts, one decision, each header read once, none on the UI thread."""
    import asyncio
    import threading

    from waiting import wait_until

    from clover_local.cli import build_parser
    from clover_local.commands.chat import start_options
    from clover_local.tui.app import CloverApp
    from clover_local.tui.screens.chat import ChatScreen

    path = _clover_on_disk(hub_server, monkeypatch)
    counts = Launches(monkeypatch)
    reads = Reads(monkeypatch)
    options = start_options(build_parser().parse_args(["chat", "clover-35b-a3b", "--ctx", "512"]))
    assert options.model_path == str(path)
    before_the_app = len(counts.header_threads)
    app = CloverApp(options)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(lambda: isinstance(app.screen, ChatScreen), "the chat screen", 240, pilot=pilot)
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        await asyncio.to_thread(chat.engine.close)
    assert counts.gathered == 1, f"facts gathered {counts.gathered} times"
    assert counts.decided == 1, f"decided {counts.decided} times"
    reads.assert_once(path.name)
    in_the_app = counts.header_threads[before_the_app:]
    assert threading.main_thread().name not in in_the_app, "a header was read on the app's UI thread"


def test_serve_of_the_clover_preset_on_disk_gathers_and_decides_once(
    monkeypatch: pytest.MonkeyPatch, hub_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve clover-35b-a3b`` with its file downloaded, up to the moment it would load: one gathering, one
    decision, each header read once."""
    from clover_local import launch as launch_module
    from clover_local.serve import runner

    path = _clover_on_disk(hub_server, monkeypatch)
    counts = Launches(monkeypatch)
    reads = Reads(monkeypatch)
    loaded: list[Any] = []

    class Loaded(Exception):
        pass

    def open_instead(launch: Any, **_: Any) -> Any:
        loaded.append(launch)
        raise Loaded

    monkeypatch.setattr(launch_module, "open_launch", open_instead)
    monkeypatch.setattr(runner, "serve_forever", lambda *a, **k: None)
    with pytest.raises(Loaded):
        _main("serve", "clover-35b-a3b", "--ctx", "512", "--port", "8999")
    capsys.readouterr()
    assert [launch.plan.model_path for launch in loaded] == [str(path)]
    assert (counts.gathered, counts.decided) == (1, 1)
    reads.assert_once(path.name)


def test_plan_of_the_clover_preset_gathers_and_decides_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plan clover-35b-a3b`` offline on a machine it fits: one gathering, one decision."""
    counts = Launches(monkeypatch)
    assert _main("plan", "clover-35b-a3b", "--offline", "--simulate", "ram=64G,gpu=nvidia:24G,cpu=16") == 0
    assert "Clover" in capsys.readouterr().out
    assert (counts.gathered, counts.decided) == (1, 1)
