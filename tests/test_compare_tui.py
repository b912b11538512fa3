"""The app's Compare screen through Pilot, with the real SmolLM2 and Gemma 3 270M: opened by ``compare --app``
(it runs at once) and by F4 over the plan screen (contenders typed in); the progress it shows, the table and the
picture; the models loaded one at a time, as the engines' own open and close say."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_compare import TASKS, Recorder, write_tasks
from waiting import wait_until

from clover_local import model_files
from clover_local.compare import openers
from clover_local.tui.app import CloverApp, StartOptions
from clover_local.tui.screens.compare import CompareScreen

pytestmark = pytest.mark.slow


async def test_compare_app_runs_the_contenders_and_shows_table_and_picture(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(openers.open_contender)
    monkeypatch.setattr(openers, "open_contender", recorder)
    tasks = write_tasks(tmp_path, TASKS[:2])
    app = CloverApp(StartOptions(compare=(str(smollm2_path), str(gemma_path)), compare_tasks=str(tasks)))
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_until(lambda: isinstance(app.screen, CompareScreen), "the Compare screen", pilot=pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_until(lambda: screen.report is not None or screen.error, "the comparison", pilot=pilot)
        assert screen.error is None and screen.report is not None and screen.report.complete
        assert recorder.most_open == 1
        kinds = {p.kind for p in screen.steps}
        assert {"loading", "loaded", "task", "unloaded"} <= kinds
        table = str(screen.query_one("#compare-table").render())
        picture = str(screen.query_one("#compare-picture").render())
        assert "accuracy (95%)" in table and f"{smollm2_path}" in table and "/2" in table
        assert "A  " in picture and "B  " in picture and "median latency" in picture
        assert screen.saved is not None  # the report and the picture beside it, as the command writes them
        report_file, picture_file = screen.saved
        assert report_file.is_file() and picture_file.read_text().startswith("<svg")
        assert str(report_file) in str(screen.query_one("#compare-status").render())
        await pilot.press("escape")
        await wait_until(lambda: app.last_compare is not None, "the screen to return its report", pilot=pilot)
    assert app.last_compare is screen.report


async def test_f4_opens_compare_over_the_plan_and_goes_back(smollm2_path: Path, tmp_path: Path) -> None:
    from clover_local.tui.screens.plan import PlanScreen

    tasks = write_tasks(tmp_path, TASKS[:1])
    app = CloverApp(StartOptions(preset="smollm2-135m"), machine=model_files.detect())
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_until(lambda: isinstance(app.screen, PlanScreen), "the plan screen", pilot=pilot)
        await pilot.press("f4")
        await wait_until(lambda: isinstance(app.screen, CompareScreen), "the Compare screen", pilot=pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        screen.query_one("#compare-contenders").value = str(smollm2_path)  # type: ignore[attr-defined]
        screen.query_one("#compare-tasks").value = str(tasks)  # type: ignore[attr-defined]
        await pilot.click("#compare-run")
        await wait_until(lambda: screen.report is not None or screen.error, "the comparison", pilot=pilot)
        assert screen.report is not None and screen.report.contenders[0].total == 1
        await pilot.press("escape")
        await wait_until(lambda: isinstance(app.screen, PlanScreen), "back to the plan", pilot=pilot)
        assert app.last_compare is screen.report


async def test_a_bad_contender_is_said_on_the_screen(tmp_path: Path) -> None:
    app = CloverApp(StartOptions(compare=("no-such-preset-here",), compare_tasks="builtin"))
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(lambda: isinstance(app.screen, CompareScreen), "the Compare screen", pilot=pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_until(lambda: screen.error is not None, "the error", pilot=pilot)
        assert "no-such-preset-here" in (screen.error or "")
        assert not screen.running


async def test_compare_app_runs_with_the_options_given_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compare --app`` hands every option to the screen's run, as the command would run them: the sampling,
    repeats and budget each contender gets, the engine and context wished for, the key's variable, and the
    report file (``--json``)."""
    from helpers_engine import ScriptedEngine

    from clover_local.cli import main
    from clover_local.compare.options import CompareOptions, OpenedContender
    from clover_local.tui import app as app_module

    started: list[StartOptions] = []
    monkeypatch.setattr(app_module, "run_app", lambda options=None: started.append(options) or 0)
    report = tmp_path / "report.json"
    tasks = write_tasks(tmp_path, TASKS[:1])
    argv = ["compare", "smollm2-135m", "--app", "--tasks", str(tasks), "--json", str(report)]
    argv += ["--temperature", "0.5", "--repeat", "2", "--max-tokens", "7", "--seed", "9"]
    argv += ["--ctx", "512", "--engine", "embedded", "--key-env", "MY_ENDPOINT_KEY", "--system", "Be brief."]
    assert main(argv) == 0
    wanted = CompareOptions(
        max_tokens=7,
        temperature=0.5,
        repeat=2,
        seed=9,
        system="Be brief.",
        ctx=512,
        key_env="MY_ENDPOINT_KEY",
        engine="embedded",
    )
    (options,) = started
    assert options.compare_options == wanted and options.compare_report == report

    seen: list[CompareOptions] = []
    engine = ScriptedEngine()

    def opener(contender, given, machine, progress):  # type: ignore[no-untyped-def]
        seen.append(given)
        return OpenedContender(engine=engine, close=lambda: None, description="scripted")

    monkeypatch.setattr(openers, "open_contender", opener)
    app = CloverApp(options)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_until(lambda: isinstance(app.screen, CompareScreen), "the Compare screen", pilot=pilot)
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        await wait_until(lambda: screen.report is not None or screen.error, "the comparison", pilot=pilot)
        assert screen.error is None and screen.report is not None
    assert seen == [wanted], "the screen's run got the command line's options"
    assert [(r.max_tokens, r.temperature, r.seed) for r in engine.requests] == [(7, 0.5, 9), (7, 0.5, 10)]
    assert screen.saved is not None and screen.saved[0] == report and report.is_file()
