"""One plan, one story (issue 49): the parts of a plan (its summary, memory table or bars, reasons, alternatives,
command) never contradict each other, on the command line or in the app's plan screen.

Plans are made for a grid of described machines (RAM 8-64 GB; no GPU, 8, 12 and 24 GB cards), the Clover preset
and the small ones (on either engine), the automatic context and 4,096 / 16,384 / 65,536 tokens, offline and
with no runtime installed. Each is rendered as ``plan`` prints it (``commands.plan.plan_text``, with and without
``--why``) and as the app's plan screen shows it (``render.plan_summary``, the leading and folded reasons, the
bars' figures), and checked for: one context everywhere, one fit verdict in the same words, one prompt cache and
one RAM total between the bar, the table and the reasons, one speed, the leading reasons first and the rest
folded, and no sentence said twice."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from clover_local.commands.plan import plan_text
from clover_local.decide import decide
from clover_local.detect import parse_simulate
from clover_local.detect.units import format_bytes as fb
from clover_local.errors import ContextOutOfRange
from clover_local.facts import gather_facts
from clover_local.launch import LaunchRequest
from clover_local.launch_types import Launch
from clover_local.plan.reasons import LEADING, find_reason, folded_reasons, leading_reasons
from clover_local.plan.render import describe_plan, fit_verdict, plan_summary, plan_to_dict, runs_with
from clover_local.plan.speed import format_tokens_per_s
from clover_local.presets import load_preset
from clover_local.tui.widgets.memory import memory_head, memory_parts

RAMS = ("8G", "16G", "24G", "32G", "64G")
GPUS = ("", "nvidia:8G", "nvidia:12G", "nvidia:24G")
CONTEXTS = (None, 4096, 16384, 65536)
CASES = [
    ("clover-35b-a3b", None),  # runs in an upstream llama-server (a release to install): the prompt cache
    ("smollm2-135m", None),  # the embedded engine
    ("smollm2-135m", "llama-server"),  # a tiny model beside llama-server's 8 GiB prompt cache
    ("gemma3-270m", None),
]
SAID_TWICE_WORDS = 8
"""A run of this many words found twice in one plan is a sentence said twice."""


@pytest.fixture(autouse=True)
def _offline_no_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    folder = tmp_path / "runtimes"
    folder.mkdir()
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _fake_llama_server(folder: Path) -> str:
    fake = folder / "llama-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    return str(fake)


def _launches(preset: str, engine: str | None, tmp_path: Path) -> Iterator[tuple[str, Launch]]:
    """Every grid plan for ``preset``: the facts read once per machine, each context decided from them (as the
    app's plan screen does)."""
    server = _fake_llama_server(tmp_path) if engine else None
    for gpu in GPUS:
        for ram in RAMS:
            spec = f"ram={ram},cpu=8" + (f",gpu={gpu}" if gpu else "")
            machine = parse_simulate(spec)
            request = LaunchRequest(
                preset=preset,
                simulate=spec,
                offline=True,
                engine=engine,
                llama_server=server,  # type: ignore[arg-type]
            )
            facts = gather_facts(request, machine=machine)
            for ctx in CONTEXTS:
                try:
                    launch = decide(replace(request, ctx=ctx), facts)
                except ContextOutOfRange:
                    assert ctx is not None and ctx > load_preset(preset).ctx_max
                    continue
                yield f"{preset} {engine or ''} {spec} ctx={ctx}", launch


def _prose(lines: list[str]) -> list[str]:
    """The lines of ``plan``'s text that are sentences: not the memory table, not the command to paste."""
    out, table = [], False
    for line in lines:
        if line.startswith("memory "):
            table = True
        elif not line.strip():
            table = False
        elif not table and not line.startswith("  llama-server"):
            out.append(line)
    return out


def _said_twice(texts: list[str]) -> list[str]:
    """Runs of :data:`SAID_TWICE_WORDS` words that appear more than once across ``texts``."""
    runs: Counter[tuple[str, ...]] = Counter()
    for text in texts:
        words = re.findall(r"[a-z0-9_.'-]+", text.lower())
        for i in range(len(words) - SAID_TWICE_WORDS + 1):
            runs[tuple(words[i : i + SAID_TWICE_WORDS])] += 1
    return [" ".join(run) for run, n in runs.items() if n > 1]


def _contradictions(launch: Launch) -> list[str]:
    """What one plan says two ways: each finding a sentence for the failure message."""
    plan, preset = launch.plan, launch.preset
    found: list[str] = []
    cli_all = plan_text(launch, every_reason=True)
    cli_short = plan_text(launch)
    app = [plan_summary(plan)] + [r.text for r in plan.reasons] + [a.why_not for a in plan.alternatives]
    every = "\n".join([*cli_all, *app])

    # one context: the header, the app's summary, each reason that names it, the command
    if f"context {plan.ctx}" not in cli_all[0] or f"context {plan.ctx:,} tokens" not in app[0]:
        found.append(f"the summaries do not say context {plan.ctx}")
    patterns = (
        r"[Cc]ontext (\d+) tokens",
        r"context's (\d+) tokens",
        r"context full \((\d+) tokens\)",
        r"(\d+) tokens of context",
    )
    for pattern in patterns:
        for said in re.findall(pattern, every):
            if int(said) != plan.ctx:
                found.append(f"a context of {said} tokens said in a plan for {plan.ctx}")
    for default in re.findall(r"grown from the default (\d+)", every):
        if plan.ctx <= int(default):
            found.append(f"context {plan.ctx} said to be grown from the default {default}")
    for default in re.findall(r"the preset default (\d+)\)", every):
        if plan.ctx != int(default):
            found.append(f"context {plan.ctx} said to be the preset default {default}")
    argv = launch.settings.argv()
    if int(argv[argv.index("-c") + 1]) != plan.ctx * plan.parallel:
        found.append(f"the command's -c is not the plan's {plan.ctx} x {plan.parallel} slots")

    # one fit verdict, in the same words: the plan's, each device's, the app's and the command line's
    devices = (*plan.memory.gpus, plan.memory.ram)
    if plan.fits != all(d.fits for d in devices):
        found.append("the plan's verdict is not its devices'")
    verdict = fit_verdict(plan).upper()
    if (f"[{verdict}]" in cli_all[0]) == plan.fits or verdict not in app[0]:
        found.append(f"the summaries do not say {verdict}")
    if (find_reason(plan.reasons, "does-not-fit") is None) != plan.fits:
        found.append("the does-not-fit reason and the verdict disagree")
    if re.search(r"does not fit(?! well)", every, re.IGNORECASE):
        found.append("'does not fit' said where the verdict is 'does not fit well'")
    for d in devices:
        head = memory_head(d, d.name.upper())
        row = next(line for line in cli_all if line.startswith(f"{d.name} "))
        said = "" if d.fits else head.split("  ")[-1]  # the verdict after the figures
        if ("short by" in head) == d.fits or ("short by" in row) == d.fits or said not in row:
            found.append(f"{d.name}: the bar and the table disagree on whether it fits")

    # one memory figure each: the bar totals what the table totals; the prompt cache and RAM as the reasons say
    for d in devices:
        parts = memory_parts(d)
        if sum(n for kind, n in parts.items() if kind not in ("free", "margin")) != d.used_bytes:
            found.append(f"{d.name}: the bar's parts do not add up to the {fb(d.used_bytes)} planned")
    ram = plan.memory.ram
    if memory_parts(ram)["cache"] != ram.prompt_cache_bytes:
        found.append("the bar's prompt cache is not the plan's")
    ram_reason = find_reason(plan.reasons, "ram")
    if ram_reason is None or f"RAM: {fb(ram.used_bytes)} planned" not in ram_reason.text:
        found.append(f"the RAM reason does not say the {fb(ram.used_bytes)} the table and bar say")
    cache = find_reason(plan.reasons, "prompt-cache")
    if ram.prompt_cache_bytes:
        if cache is None or f"Prompt cache {fb(ram.prompt_cache_bytes)}" not in cache.text:
            found.append(f"the prompt cache reason does not say the bar's {fb(ram.prompt_cache_bytes)}")
        if argv[argv.index("--cache-ram") + 1] != str(plan.prompt_cache_mib):
            found.append("the command's --cache-ram is not the plan's")

    # one speed, one runner
    if plan.diffusion is None:
        speed = format_tokens_per_s(plan.predicted_tokens_per_s)
        if f"~{speed} tokens/s" not in cli_all[0] or f"about {speed} tokens/s" not in app[0]:
            found.append(f"the summaries do not say ~{speed} tokens/s")
        if not any(f"~{speed} tokens/s" in r.text for r in leading_reasons(plan.reasons)):
            found.append("no leading reason says the speed the summaries say")
    if f"Runs with: {runs_with(plan)}" not in cli_all or f"Runs with: {runs_with(plan)}" not in app[0]:
        found.append("the command line and the app name different runners")

    # the leading reasons first, the rest folded (shown with --why); --json has them all with their codes
    short, full = "\n".join(cli_short), "\n".join(cli_all)
    for r in plan.reasons:
        if r.text not in full:
            found.append(f"--why leaves out the {r.code} reason")
        if (f"  - {r.text}\n" in short + "\n") != (r.code in LEADING):
            found.append(f"the {r.code} reason is {'not ' if r.code in LEADING else ''}shown without --why")
    if len(leading_reasons(plan.reasons)) + len(folded_reasons(plan.reasons)) != len(plan.reasons):
        found.append("a reason is neither leading nor folded")
    why = plan_to_dict(plan)["why"]
    if [(w["code"], w["text"], w["leads"]) for w in why] != [
        (r.code, r.text, r.code in LEADING) for r in plan.reasons
    ]:
        found.append("--json's why is not the plan's reasons with their codes")
    if (
        describe_plan(plan, preset, every_reason=True)
        != cli_all[: len(describe_plan(plan, preset, every_reason=True))]
    ):
        found.append("plan_text does not begin with the plan")

    # no sentence said twice, on the command line (with every reason) or in the app
    for where, texts in (("plan --why", _prose(cli_all)), ("the app", app)):
        found += [f"said twice in {where}: '{run}...'" for run in _said_twice(texts)]
    return found


@pytest.mark.parametrize(("preset", "engine"), CASES, ids=[f"{p}-{e or 'auto'}" for p, e in CASES])
def test_no_plan_contradicts_itself(preset: str, engine: str | None, tmp_path: Path) -> None:
    failures: list[str] = []
    count = 0
    for name, launch in _launches(preset, engine, tmp_path):
        count += 1
        failures += [f"{name}: {f}" for f in _contradictions(launch)]
    assert count >= len(RAMS) * len(GPUS) * 2, "the grid was planned"
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} in all)"


def test_a_context_below_the_preset_default_is_not_said_to_be_grown() -> None:
    """A model trained for less than the preset's default context is planned for what it takes, and said so
    (it was once "Context 4096 tokens (grown from the default 16384)")."""
    from clover_local.gguf.model import describe_from_preset
    from clover_local.plan.planner import make_plan

    preset = load_preset("clover-35b-a3b")
    model = describe_from_preset(preset, "Q4_K_M")
    short = replace(model, architecture=replace(model.architecture, n_ctx_train=4096))
    plan = make_plan(parse_simulate("ram=64G,cpu=8"), preset, short)
    reason = find_reason(plan.reasons, "context")
    assert plan.ctx == 4096 < preset.ctx_default and reason is not None
    assert f"the most this model takes (4096), below the preset default {preset.ctx_default}" in reason.text
    assert "grown" not in reason.text


def test_the_offline_sentence_is_said_once() -> None:
    """Offline, the Clover plan says once that the latest release was not asked (it was said inside itself, and
    again in the engine's note)."""
    from clover_local.launch import decide_launch

    launch = decide_launch(
        LaunchRequest(preset="clover-35b-a3b", simulate="ram=16G,gpu=nvidia:8G,cpu=8", offline=True),
        machine=parse_simulate("ram=16G,gpu=nvidia:8G,cpu=8"),
    )
    text = "\n".join(plan_text(launch, every_reason=True))
    assert text.lower().count("the latest llama.cpp release was not asked") == 1, text
    assert "Engine: llama-server (no llama.cpp here loads the architecture 'clover_moe'" in text


async def test_the_apps_plan_screen_leads_with_what_decides_and_expands_the_rest() -> None:
    """The app's plan screen shows the leading reasons, and the rest behind an expander that Enter opens;
    what it shows is the summary, verdict and reasons the grid above checks, and its bars say each device's
    verdict in the command line's words."""
    from textual.widgets import Collapsible, Static
    from waiting import wait_until

    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen
    from clover_local.tui.widgets.memory import MemoryView

    machine = "ram=16G,gpu=nvidia:8G,cpu=8"  # Q4_K_M does not fit well here
    app = CloverApp(StartOptions(preset="clover-35b-a3b"), machine=parse_simulate(machine))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.launch is not None, "the plan", pilot=pilot)
        assert screen.launch is not None
        plan = screen.launch.plan
        assert not plan.fits and not _contradictions(screen.launch)
        summary = str(screen.query_one("#plan-summary", Static).render())
        assert summary == plan_summary(plan) and "DOES NOT FIT WELL" in summary
        shown = str(screen.query_one("#plan-reasons", Static).render())
        assert shown == "\n".join(f"• {r.text}" for r in leading_reasons(plan.reasons))
        assert [r.code for r in leading_reasons(plan.reasons)][:2] == ["quant", "placement"]
        folded = folded_reasons(plan.reasons)
        more = screen.query_one("#plan-more", Collapsible)
        assert more.collapsed and more.title == f"{len(folded)} more reasons"
        assert not screen.query_one("#plan-more-reasons", Static).region.height  # folded: not on screen
        title = more.query_one("CollapsibleTitle")
        title.focus()  # Tab reaches it; Enter opens it
        await pilot.press("enter")
        await wait_until(lambda: not more.collapsed, "the reasons to expand", pilot=pilot)
        hidden = str(screen.query_one("#plan-more-reasons", Static).render())
        assert hidden == "\n".join(f"• {r.text}" for r in folded)
        short = [bar for bar in screen.query(MemoryView) if not bar.device.fits]
        assert short and all("short by" in str(bar.render()) for bar in short)
