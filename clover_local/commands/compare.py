"""``clover-local compare A B [...]``: the same tasks through each model on this machine, accuracy and latency
side by side (a table, a picture, a JSON report). See docs/compare.md."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from clover_local.commands.download import StatusLine
from clover_local.errors import UsageError

if TYPE_CHECKING:
    from clover_local.compare.contenders import Contender
    from clover_local.compare.options import CompareOptions, Progress
    from clover_local.compare.report import CompareReport
    from clover_local.compare.tasks import TaskSet
    from clover_local.detect.machine import Machine


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "compare",
        help="compare models on the same tasks on this machine: accuracy and latency side by side",
        description=(
            "Runs the same tasks through each contender, one at a time (each local model planned for this machine "
            "and unloaded before the next loads), checks every reply, and prints accuracy with a 95%% interval, "
            "median TTFT, decode speed and latency, peak memory, and a paired test between each two contenders. "
            "A contender is a preset name, a .gguf path, hf:OWNER/REPO[:QUANT], or an OpenAI-compatible endpoint "
            "URL#MODEL (e.g. http://localhost:11434/v1#qwen3:30b-a3b)."
        ),
    )
    parser.add_argument("contenders", nargs="*", metavar="CONTENDER", help="two or more models to compare")
    parser.add_argument(
        "--tasks",
        default=None,
        metavar="builtin|FILE",
        help="the built-in suite (default) or a .jsonl/.yaml file",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="write the whole report to FILE (and a picture beside it)"
    )
    parser.add_argument("--show", metavar="FILE", help="print a saved report again and exit")
    parser.add_argument("--resume", metavar="FILE", help="go on with an interrupted run saved in FILE")
    parser.add_argument("--repeat", type=int, default=1, metavar="K", help="runs of each task (1)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="sampling temperature (0: greedy, the default)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, metavar="N", help="token budget per reply (256)"
    )
    parser.add_argument(
        "--seed", type=int, default=1, metavar="N", help="seed of the first run of each task (1)"
    )
    parser.add_argument("--system", metavar="TEXT", help="a system prompt for every task that has none")
    parser.add_argument(
        "--ctx", type=int, metavar="N", help="context of every local model (default: each plan's)"
    )
    parser.add_argument(
        "--key-env",
        metavar="VAR",
        help="the environment variable holding the endpoints' API key (the key itself is never an option)",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "embedded", "llama-server"),
        help="the engine for every local model (default: each launch's own; llama-server where only it runs one)",
    )
    parser.add_argument("--app", action="store_true", help="run the comparison in the app's Compare screen")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.compare.picture import text_picture
    from clover_local.compare.report import format_table, load_report

    if args.show:
        report = load_report(args.show)
        print(f"{format_table(report)}\n\n{text_picture(report)}")
        return 0
    previous = load_report(args.resume) if args.resume else None
    contenders, tasks, options = _what_to_run(args, previous)
    if args.app:
        from clover_local.tui.app import StartOptions, run_app

        report = args.json or args.resume
        return run_app(
            StartOptions(
                compare=tuple(c.name for c in contenders),
                compare_tasks=tasks.source,
                compare_options=options,
                compare_report=Path(report).expanduser() if report else None,
                compare_previous=previous,
            )
        )
    from clover_local.compare.openers import check_contenders

    check_contenders(contenders, options)  # before any model loads
    from clover_local.compare.report import default_report_path

    out = Path(args.json or args.resume or default_report_path()).expanduser()
    return _run(contenders, tasks, options, previous, out)


def _what_to_run(
    args: argparse.Namespace, previous: CompareReport | None
) -> tuple[list[Contender], TaskSet, CompareOptions]:
    from clover_local.compare.contenders import parse_contenders
    from clover_local.compare.options import CompareOptions
    from clover_local.compare.tasks import BUILTIN, load_tasks

    if args.repeat < 1 or args.max_tokens < 1 or args.temperature < 0:
        raise UsageError("--repeat and --max-tokens must be at least 1, --temperature at least 0.")
    if args.key_env is not None and not ENV_NAME.match(args.key_env):
        raise UsageError(  # not echoed: what was given may be the key itself
            "--key-env takes the name of an environment variable (letters, digits and _), not a key.",
            "export OPENAI_API_KEY=... and give --key-env OPENAI_API_KEY.",
        )
    options = CompareOptions(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        repeat=args.repeat,
        seed=args.seed,
        system=args.system,
        ctx=args.ctx,
        key_env=args.key_env,
        engine=args.engine,
    )
    names = list(args.contenders)
    source = args.tasks or BUILTIN
    if previous is not None:
        names = names or [c.name for c in previous.contenders]
        source = args.tasks or previous.tasks_source
        if options == CompareOptions(key_env=args.key_env, engine=args.engine):  # as the run being resumed
            saved = {**previous.options, "key_env": args.key_env or previous.options.get("key_env")}
            options = CompareOptions(**saved)
    return parse_contenders(names), load_tasks(source), options


def machine_line(machine: Machine) -> str:
    """The machine in one line, for the report."""
    gib = 2**30
    gpus = ", ".join(f"{g.name} {g.total_bytes / gib:.0f} GiB" for g in machine.gpus) or "no GPU"
    return (
        f"{machine.cpu.model or 'CPU'} ({machine.cpu.physical_cores} cores), "
        f"{machine.memory.total_bytes / gib:.0f} GiB RAM, {gpus}"
    )


def _run(
    contenders: list[Contender],
    tasks: TaskSet,
    options: CompareOptions,
    previous: CompareReport | None,
    out: Path,
) -> int:
    from clover_local import model_files
    from clover_local.compare.picture import save_picture, text_picture
    from clover_local.compare.report import format_table, save_report
    from clover_local.compare.runner import run_compare

    machine = model_files.detect()
    bar = ProgressLine(sys.stderr)
    report = run_compare(
        contenders,
        tasks,
        options,
        machine=machine,
        previous=previous,
        save=lambda report: save_report(report, out),
        on_progress=bar,
        machine_text=machine_line(machine),
    )
    bar.end()
    picture = save_picture(report, out)
    print(f"{format_table(report)}\n\n{text_picture(report)}\n\nReport: {out}\nPicture: {picture}")
    if not report.complete:
        print(
            f"Interrupted: what is done is kept. Go on with: clover-local compare --resume {out}",
            file=sys.stderr,
        )
        return 130
    return 0


class ProgressLine(StatusLine):
    """What runs now and an estimate of the time left, on one line rewritten in place (a line per step when
    stderr is not a terminal)."""

    WIDTH = 24
    DOWNLOAD_LOG_EVERY_S = 5.0
    """Not on a terminal, a download's progress is written this seldom (it comes many times a second)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._last_download = float("-inf")

    def __call__(self, p: Progress) -> None:
        from clover_local.fetch.progress import format_duration

        if p.kind == "downloading":
            if not self.tty and time.monotonic() - self._last_download < self.DOWNLOAD_LOG_EVERY_S:
                return
            self._last_download = time.monotonic()
            self.show(f"{p.contender}: {p.message}")
            return
        filled = round(self.WIDTH * p.done / p.total) if p.total else 0
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        what = {"task": p.task, "failed": "could not run"}.get(p.kind, p.kind)
        left = f", about {format_duration(p.eta_s)} left" if p.eta_s is not None else ""
        line = f"[{bar}] {p.done}/{p.total} {p.contender}: {what}{left}"
        if p.kind == "failed":
            line += f"\n  {p.message}"
        self.show(line)
