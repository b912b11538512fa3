"""Runs a comparison fairly: every contender gets the same tasks, the same sampling (greedy unless asked), the
same token budget and system prompt, each through its own chat template and tool format.

Local contenders are planned for this machine and loaded through ``launch.open_launch``, one after another: the
previous one is closed before the next loads, never two at once. An endpoint is measured in turn too, so no
local model is loaded while it answers. After each task the report is handed to ``save``, so an interrupted run
(Ctrl-C) keeps what is done and ``resume`` goes on without running a finished task again. A contender that cannot
run (an endpoint that is down, a model that does not fit) is an error for it alone; the others still run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from clover_local.compare.checks import Reply, run_check
from clover_local.compare.contenders import Contender
from clover_local.compare.memory import MemorySampler
from clover_local.compare.options import CompareOptions, Opener, Progress, ProgressKind
from clover_local.compare.report import CompareReport, ContenderResult, TaskResult
from clover_local.compare.saferegex import SafeRegex
from clover_local.compare.tasks import Task, TaskSet
from clover_local.engine.types import (
    ChatEngine,
    ChatMessage,
    Finished,
    GenerationRequest,
    GenerationStats,
    TextDelta,
    ToolCall,
    ToolCallMade,
)
from clover_local.errors import CloverError, UsageError

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine


class ContenderStopped(CloverError):
    """The contender cannot go on (its endpoint stopped answering)."""


@dataclass
class _Run:
    """What every contender of one run shares, and how far the run has got."""

    options: CompareOptions
    opener: Opener
    machine: Machine | None
    regex: SafeRegex
    progress: Callable[[Progress], None]
    cancel: threading.Event | None
    save: Callable[[], None]
    total: int
    done: int
    task_s: float = 0.0
    """Seconds the tasks run so far took (``tasks`` of them): the time left is told from it."""
    tasks: int = 0

    def tell(self, kind: ProgressKind, contender: str, task: str = "", message: str = "") -> None:
        eta = self.task_s / self.tasks * (self.total - self.done) if self.tasks and kind != "failed" else None
        self.progress(Progress(kind, contender, task, self.done, self.total, eta, message))

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


def run_compare(
    contenders: Sequence[Contender],
    tasks: TaskSet,
    options: CompareOptions,
    *,
    opener: Opener | None = None,
    machine: Machine | None = None,
    previous: CompareReport | None = None,
    save: Callable[[CompareReport], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
    machine_text: str = "",
) -> CompareReport:
    """Every contender through every task (each ``options.repeat`` times), one contender at a time; the report
    (``complete`` False when interrupted or cancelled). ``previous``: a saved report of the same tasks and
    options, whose finished tasks are kept and not run again."""
    from clover_local.compare.openers import open_contender

    report = _start_report(contenders, tasks, options, previous, machine_text)
    run = _Run(
        options,
        opener or open_contender,
        machine,
        SafeRegex(),
        on_progress or (lambda _p: None),
        cancel,
        lambda: save(report) if save else None,
        total=len(contenders) * len(tasks.tasks) * options.repeat,
        done=sum(len(c.tasks) for c in report.contenders),
    )
    interrupted = False
    with run.regex:
        for contender in contenders:
            result = report.contender(contender.name)
            assert result is not None
            finished = {t.key for t in result.tasks}
            todo = [
                (t, r) for t in tasks.tasks for r in range(options.repeat) if f"{t.id}#{r}" not in finished
            ]
            if not todo:
                continue
            result.error = None
            try:
                _run_contender(contender, result, todo, run)
            except KeyboardInterrupt:
                interrupted = True
            if interrupted or run.cancelled:
                interrupted = True
                break
    report.complete = not interrupted and all(
        len(c.tasks) == len(tasks.tasks) * options.repeat or c.error for c in report.contenders
    )
    if save:
        save(report)
    return report


def _start_report(
    contenders: Sequence[Contender],
    tasks: TaskSet,
    options: CompareOptions,
    previous: CompareReport | None,
    machine_text: str,
) -> CompareReport:
    fresh = CompareReport(
        [ContenderResult(c.name, c.kind) for c in contenders],
        tasks.source,
        tasks.digest,
        list(tasks.ids),
        options.as_json(),
        machine_text,
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    if previous is None:
        return fresh
    if previous.tasks_digest != tasks.digest:
        raise UsageError(
            "The report to resume ran other tasks (the tasks file changed since).",
            "Resume with the same --tasks, or start again without --resume.",
        )
    if previous.options != options.as_json():
        raise UsageError(
            f"The report to resume used other options ({previous.options}).",
            "Resume with the same --max-tokens, --temperature, --repeat, --seed, --system and --ctx.",
        )
    names = [c.name for c in contenders]
    if [c.name for c in previous.contenders] != names:
        raise UsageError(
            f"The report to resume compared {', '.join(c.name for c in previous.contenders)}.",
            "Resume with the same contenders, in the same order.",
        )
    valid = set(tasks.ids)
    for c in previous.contenders:
        c.tasks = [t for t in c.tasks if t.id in valid and t.repeat < options.repeat and t.error is None]
    return replace(previous, complete=False, machine=machine_text or previous.machine)


def _run_contender(
    contender: Contender, result: ContenderResult, todo: list[tuple[Task, int]], run: _Run
) -> None:
    """The contender's remaining tasks, loaded once and closed after (also when interrupted)."""
    name = contender.name
    run.tell("loading", name)
    sampler = MemorySampler()
    sampler.baseline()
    try:
        opened = run.opener(contender, run.options, run.machine, run.progress)
    except CloverError as exc:
        result.error = str(exc)
        run.tell("failed", name, message=str(exc))
        run.save()
        return
    result.engine = opened.description
    said = [n.text for n in opened.notices]  # the report keeps what was shown
    result.notices = [*result.notices, *(s for s in said if s not in result.notices)]
    try:
        if opened.holder_pid is not None:
            sampler.start(opened.holder_pid, in_process=opened.in_process)
        run.tell("loaded", name)
        for task, repeat in todo:
            if run.cancelled:
                break
            run.tell("task", name, task.id)
            started = time.monotonic()
            try:
                outcome = run_task(opened.engine, task, repeat, run.options, run.regex)
            except ContenderStopped as exc:
                result.error = str(exc)
                run.tell("failed", name, task.id, message=str(exc))
                break
            run.task_s += time.monotonic() - started
            run.tasks += 1
            result.tasks.append(outcome)
            run.done += 1
            run.save()
    finally:
        opened.close()
        sampler.stop()
        result.peak_ram_bytes = sampler.peak_ram_bytes if opened.holder_pid is not None else None
        result.peak_vram_bytes = {str(k): v for k, v in sampler.peak_vram_bytes.items()}
        run.tell("unloaded", name)
        run.save()


def task_request(task: Task, repeat: int, options: CompareOptions) -> GenerationRequest:
    """The request every contender gets for ``task``: plain temperature sampling (greedy at 0), the same
    budget and seed, the whole prompt evaluated afresh (no cache from the task before)."""
    messages = task.messages
    if options.system and messages[0].role != "system":
        messages = (ChatMessage("system", options.system), *messages)
    return GenerationRequest(
        messages=messages,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        seed=options.seed + repeat,
        tools=task.tools,
        cache_prompt=False,
    )


def run_task(
    engine: ChatEngine, task: Task, repeat: int, options: CompareOptions, regex: SafeRegex
) -> TaskResult:
    """One reply, measured and checked. An engine error fails the task (saying why), except an endpoint that
    can no longer be reached, which stops its contender (:class:`ContenderStopped`)."""
    from clover_local.compare.endpoint import EndpointUnreachable

    request = task_request(task, repeat, options)
    parts: list[str] = []
    calls: list[ToolCall] = []
    stats: GenerationStats | None = None
    error: str | None = None
    started = time.perf_counter()
    try:
        for event in engine.generate(request):
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, ToolCallMade):
                calls.append(event.call)
            elif isinstance(event, Finished):
                stats = event.stats
    except EndpointUnreachable as exc:
        raise ContenderStopped(exc.what, exc.fix) from None
    except CloverError as exc:
        error = str(exc)
    latency = time.perf_counter() - started
    text = "".join(parts)
    reply = Reply(text, tuple(calls))
    asserts = tuple(run_check(c, reply, regex) for c in task.checks) if error is None else ()
    return TaskResult(
        id=task.id,
        repeat=repeat,
        reply=text,
        tool_calls=tuple(_call_json(c) for c in calls),
        passed=error is None and all(a.passed for a in asserts),
        asserts=asserts,
        ttft_s=stats.ttft_s if stats else None,
        latency_s=latency if error is None else None,
        decode_tok_s=stats.decode_tokens_per_s if stats and stats.decode_tokens_per_s > 0 else None,
        tokens_in=stats.prompt_tokens if stats else 0,
        tokens_out=stats.completion_tokens if stats else 0,
        finish=stats.finish_reason if stats else "",
        error=error,
    )


def _call_json(call: ToolCall) -> dict[str, Any]:
    import json

    try:
        arguments: Any = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = call.arguments
    return {"name": call.name, "arguments": arguments}
