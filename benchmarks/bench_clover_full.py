#!/usr/bin/env python3
"""Clover's path at full size, side by side in one run: the launch the product decides (``decide_launch``, opened
by ``open_launch`` as ``chat`` and ``serve`` open it: the installed runtime's llama-server with the plan's flags),
upstream llama-server on its own defaults (the same model, context and threads, nothing else), and a small grid
around the plan, one setting changed at a time: threads, ``-b``/``-ub``, repacking on/off, mmap vs reading the
file (``--load-mode``), the KV cache type, ``--spec-type`` none / ngram-mod / ngram-simple. Every flag a variant
uses is checked against the runtime's own list (its ``--help``, else the ``common/arg.cpp`` kept beside it):
one it lacks is not guessed, the variant is left out with the reason.

Each variant is one llama-server, started, measured through the product's own client (``LlamaServerEngine``),
and stopped before the next, so one model is in memory at a time:

- load: from starting the process to its ``/health`` answering;
- prompt tokens/s at ~500 and ~4000 tokens (a fresh prompt, nothing cached), decode tokens/s (128 tokens,
  greedy, on a prompt that repeats code, where n-gram drafts can land), as llama-server times them;
- an agent turn: a conversation that grows by a tool result (~400 tokens) each turn, the reply capped, each turn
  reusing the cache as the product does; the time of each turn, the last one reported;
- peak resident memory of the server (the kernel's ``VmHWM``), and its GPU memory (NVML) where there is one;

beside the plan's prediction (decode speed, RAM and GPU memory) and as ratios to upstream's defaults.
``--busy`` measures upstream's defaults and the launch again beside a program that keeps one core busy (the
launch decided while it runs, as a person's would be); ``--record`` keeps the launch's plain decode speed (with
speculation off, the grid's ``--spec-type none``, where measured: the planner's speeds are plain decoding, as
llama-bench's) for the planner, so later plans on this machine say "measured" instead of estimating.

The model: ``--model PATH`` (any GGUF: a tiny clover_moe model smoke-tests it on any machine), else the
Clover-shaped full-size GGUF (``clover_local.testing.clover_shaped``, 19.7 GiB, architecture ``clover_moe``),
written first with ``--write-model PATH`` when it is not there. Nothing depends on the machine: the plan decides
threads, context and placement for whatever runs it (2 cores and 24 GB, or a GPU box), and ``--deadline-s``
stops starting variants when a time budget (a 10-minute device call) is nearly spent, keeping what was measured.

    .venv/bin/python benchmarks/bench_clover_full.py --write-model ~/clover-shaped.gguf [--json out.json]
    .venv/bin/python benchmarks/bench_clover_full.py --model ~/clover-shaped.gguf --grid-quick --busy --record
    .venv/bin/python benchmarks/bench_clover_full.py --model ~/clover-shaped.gguf --grid none --ncmoe 0,10,20 --fit-on
    .venv/bin/python benchmarks/bench_clover_full.py --model .models/tiny-clover_moe-f16-*.gguf --prompts 200,800

Needs an installed runtime that loads the model (``clover-local runtime install b12060``; the tests' runtime,
``scripts/make_test_runtime.py``, loads clover_moe too: ``CLOVER_RUNTIMES_DIR=<it>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clover_local  # noqa: F401  (loads libllama before numpy, as every entry point does)
from _texts import CODE, words
from clover_local.engine.types import ChatMessage, Finished, GenerationRequest, GenerationStats
from clover_local.launch import Launch, LaunchRequest, decide_launch, open_launch
from clover_local.llamacpp.binary import Capabilities
from clover_local.llamacpp.server import LlamaServerProcess, start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine

UPSTREAM = "upstream defaults"
PRODUCT = "clover-local (decided launch)"


@dataclass(frozen=True)
class Variant:
    """One llama-server to measure: the product's launch (``argv`` None), upstream's defaults, or the plan with
    one setting changed."""

    name: str
    argv: tuple[str, ...] | None
    changed: str = ""
    """What differs from the plan, in words."""
    predicted_tokens_per_s: float | None = None


@dataclass
class Result:
    """What one variant measured (each list: one value per round; the report takes the median)."""

    name: str
    changed: str
    argv: list[str]
    load_s: float = 0.0
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    """Asked size -> the prompt's tokens as llama-server counted them."""
    prompt_tokens_per_s: dict[str, list[float]] = field(default_factory=dict)
    decode_tokens_per_s: list[float] = field(default_factory=list)
    decode_tokens: int = 0
    draft_acceptance: float | None = None
    turn_s: list[list[float]] = field(default_factory=list)
    """Per round, the time of each agent turn."""
    peak_rss_bytes: int = 0
    peak_gpu_bytes: int = 0
    predicted_tokens_per_s: float | None = None
    error: str | None = None

    def prompt_speed(self, size: str) -> float:
        values = self.prompt_tokens_per_s.get(size, [])
        return statistics.median(values) if values else 0.0

    @property
    def decode_speed(self) -> float:
        return statistics.median(self.decode_tokens_per_s) if self.decode_tokens_per_s else 0.0

    @property
    def last_turn_s(self) -> float:
        lasts = [t[-1] for t in self.turn_s if t]
        return statistics.median(lasts) if lasts else 0.0


def main() -> int:
    args = _parse_args()
    model = _model(args)
    request = LaunchRequest(
        args.preset, str(model), ctx=args.ctx, threads=args.threads, spec="auto", parallel=1
    )
    launch = decide_launch(request)
    if launch.runner.kind != "llama-server" or launch.runner.binary is None:
        why = launch.runner.install or launch.runner.why
        raise SystemExit(f"The launch does not run in an installed runtime's llama-server here ({why}).")
    caps = _capabilities(launch)
    variants, skipped = _variants(args, launch, caps)
    started = time.monotonic()
    results: list[Result] = []
    for v in variants:
        if args.deadline_s and time.monotonic() - started > args.deadline_s:
            skipped.append(f"{v.name}: not started, the --deadline-s {args.deadline_s:g} s was reached")
            continue
        quick = args.grid_quick and v.name not in (UPSTREAM, PRODUCT)
        results.append(_measure(v, launch, args, quick=quick))
        _log(_row(results[-1], results[0] if results[0].name == UPSTREAM else None))
        if args.json:
            _write(args.json, launch, results, skipped)
    if args.busy:
        results += _beside_a_busy_program(request, launch, args)
        if args.json:
            _write(args.json, launch, results, skipped)
    if args.record:
        _record(launch, _plain_decoding(results))
    print(_report(launch, results, skipped))
    if args.json:
        _write(args.json, launch, results, skipped)
    return 0 if all(r.error is None for r in results) else 1


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="a local GGUF")
    src.add_argument(
        "--write-model",
        type=Path,
        metavar="PATH",
        help="the Clover-shaped full-size GGUF (architecture clover_moe), written there first when missing",
    )
    p.add_argument("--preset", help="whose settings to plan with (default: the one the file's name says)")
    p.add_argument("--ctx", type=int, help="context (default: the plan's)")
    p.add_argument("--threads", type=int, help="threads at most (default: the plan's)")
    p.add_argument("--grid", choices=("small", "none"), default="small", help="the grid around the plan")
    p.add_argument(
        "--ncmoe",
        default="",
        help="also these --n-cpu-moe values (GPU), e.g. 0,10,20; around:S is the plan's value -2S, -S, +S, +2S",
    )
    p.add_argument("--fit-on", action="store_true", help="also the plan's launch with llama.cpp's --fit on")
    p.add_argument("--no-upstream", action="store_true", help="leave out upstream's defaults")
    p.add_argument("--prompts", default="500,4000", help="prompt sizes in tokens (default: 500,4000)")
    p.add_argument("--decode", type=int, default=128, help="tokens decoded (default: 128)")
    p.add_argument(
        "--turns", type=int, default=4, help="agent turns on the growing conversation (default: 4)"
    )
    p.add_argument("--rounds", type=int, default=1, help="measurements per variant, the median kept")
    p.add_argument(
        "--grid-quick",
        action="store_true",
        help="grid variants measure the first prompt size and decoding only (upstream and the launch: all)",
    )
    p.add_argument(
        "--busy",
        action="store_true",
        help="also upstream's defaults and the launch (decided again) beside a program that keeps one core busy",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="record the launch's measured decode speed for the planner (as `bench --llama-bench` does)",
    )
    p.add_argument("--deadline-s", type=float, default=0.0, help="start no variant after this many seconds")
    p.add_argument("--ready-timeout-s", type=float, default=900.0, help="longest a load may take")
    p.add_argument("--json", type=Path, help="write the report here too (after each variant)")
    return p.parse_args()


def _log(text: str) -> None:
    print(f"[bench_clover_full] {text}", file=sys.stderr, flush=True)


def _model(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return Path(args.model).expanduser()
    path = Path(args.write_model).expanduser()
    if not path.is_file():
        import shutil

        from clover_local.testing.clover_shaped import tensor_plan, write_clover_shaped

        need = sum(t.n_bytes for t in tensor_plan()) + (64 << 20)
        free = shutil.disk_usage(path.parent).free
        if free < need:
            raise SystemExit(
                f"{path.parent} has {free / 2**30:.1f} GiB free; the model needs {need / 2**30:.1f} GiB."
            )
        _log(f"writing the Clover-shaped GGUF (clover_moe) to {path}")
        write_clover_shaped(path, arch="clover_moe")
    return path


def _capabilities(launch: Launch) -> Capabilities:
    """The runtime's flags: its ``--help``, else the ``arg.cpp`` kept beside it (as the launch fits them)."""
    from clover_local import settings
    from clover_local.errors import ServerError
    from clover_local.llamacpp.binary import capabilities, capabilities_from_arg_cpp

    assert launch.runner.binary is not None
    try:
        return capabilities(launch.runner.binary.path)
    except ServerError:
        kept = settings.runtimes_dir() / str(launch.runner.runtime) / "arg.cpp"
        return capabilities_from_arg_cpp(kept.read_text(encoding="utf-8", errors="replace"), "kept")


# -- the variants ------------------------------------------------------------------------------------------


def _variants(
    args: argparse.Namespace, launch: Launch, caps: Capabilities
) -> tuple[list[Variant], list[str]]:
    """Upstream's defaults, the product's launch, then the grid: each a change of the launch's argv, made only
    with flags the runtime lists (the others said in the second list)."""
    plan, base = launch.plan, tuple(launch.argv)
    model = plan.model_path or ""
    out: list[Variant] = []
    skipped: list[str] = []
    if not args.no_upstream:
        upstream = ("-m", model, "-c", str(plan.ctx * plan.parallel), "-t", str(plan.threads))
        out.append(Variant(UPSTREAM, upstream, "llama-server's own defaults, same model, context, threads"))
    out.append(Variant(PRODUCT, None, "", plan.predicted_tokens_per_s))

    def change(
        name: str,
        what: str,
        edit: Callable[[list[str]], list[str]],
        *flags: str,
        predicted: float | None = None,
    ) -> None:
        missing = [f for f in flags if not caps.supports(f)]
        if missing:
            skipped.append(f"{name}: this llama-server lists no {', '.join(missing)}")
            return
        argv = tuple(edit(list(base)))
        if argv == base:
            skipped.append(f"{name}: the same as the plan")
            return
        out.append(Variant(name, argv, what, predicted))

    if args.grid == "small":
        t = plan.threads
        for threads in sorted({max(1, t // 2), t + 1 if t < (os.cpu_count() or t) else t} - {t}):
            # The plan's prediction at that thread count: the same request, planned with --threads N.
            again = decide_launch(replace(launch.request, threads=threads), machine=launch.machine)
            change(
                f"-t {threads}",
                f"threads {t} -> {threads}",
                _set("-t", threads, "-tb", threads),
                "-t",
                "-tb",
                predicted=again.plan.predicted_tokens_per_s,
            )
        for b, ub in ((512, 512), (4096, 1024)):
            if (b, ub) != (plan.n_batch, plan.n_ubatch):
                change(
                    f"-b {b} -ub {ub}",
                    f"batch {plan.n_batch}/{plan.n_ubatch} -> {b}/{ub}",
                    _set("-b", b, "-ub", ub),
                    "-b",
                    "-ub",
                )
        _repack_variant(change, plan.repack)
        mode = _value(base, "--load-mode")
        for other in ("mmap", "none"):
            if mode is not None and other != mode:
                change(
                    f"--load-mode {other}",
                    f"load mode {mode} -> {other}",
                    _set("--load-mode", other),
                    "--load-mode",
                )
        kv = plan.cache_type_k
        other_kv = "q8_0" if kv == "f16" else "f16"
        change(
            f"KV {other_kv}",
            f"KV cache {kv} -> {other_kv}",
            _set("-ctk", other_kv, "-ctv", other_kv),
            "-ctk",
            "-ctv",
        )
        spec = caps.spec("--spec-type")
        types = spec.choices if spec is not None else ()
        asked = _value(base, "--spec-type") or "none"
        for kind in ("none", "ngram-mod", "ngram-simple"):
            if kind == asked:
                continue
            if types and kind not in types:
                skipped.append(f"--spec-type {kind}: this llama-server lists {', '.join(types)}")
                continue
            change(f"--spec-type {kind}", f"speculation {asked} -> {kind}", _spec(kind), "--spec-type")
    if args.fit_on:
        change(
            "--fit on",
            "llama.cpp fits -ngl and --n-cpu-moe itself",
            lambda a: _set("--fit", "on")(_drop(_drop(a, "-ngl"), "--n-cpu-moe")),
            "--fit",
        )
    for n in _ncmoe_values(args.ncmoe, plan.n_cpu_moe, plan.n_gpu_layers):
        change(
            f"--n-cpu-moe {n}",
            f"experts of {plan.n_cpu_moe} -> {n} layers in RAM",
            _set("-ngl", "all", "--n-cpu-moe", n),
            "--n-cpu-moe",
        )
    return out, skipped


def _ncmoe_values(text: str, planned: int, n_gpu_layers: int) -> list[int]:
    """``--ncmoe``'s values: a list, or ``around:S`` (the plan's value -2S, -S, +S, +2S, none below 0); none
    for a plan that puts nothing on a GPU."""
    if not text.strip() or n_gpu_layers == 0:
        return []
    if text.startswith("around:"):
        step = int(text.split(":", 1)[1])
        values = [planned + k * step for k in (-2, -1, 1, 2)]
    else:
        values = [int(x) for x in text.split(",") if x.strip()]
    return [v for v in dict.fromkeys(values) if 0 <= v <= 64 and v != planned]


def _repack_variant(change: Callable[..., None], planned: bool) -> None:
    from clover_local.engine.repack import repack_safe_here

    if planned and repack_safe_here():
        change("--no-repack", "repacking on -> off", lambda a: [*a, "--no-repack"], "--no-repack")
    elif repack_safe_here():
        change(
            "--repack",
            "repacking off -> on",
            lambda a: [x for x in a if x not in ("--no-repack", "-nr")],
            "--repack",
        )
    # else: this CPU's llama.cpp crashes when it repacks (engine.repack): never measured here


def _value(argv: Sequence[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def _drop(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return argv
    at = argv.index(flag)
    return argv[:at] + argv[at + 2 :]


def _set(*pairs: object) -> Callable[[list[str]], list[str]]:
    """An edit that sets each flag of ``pairs`` (flag, value, flag, value...) to its value, added if absent."""

    def edit(argv: list[str]) -> list[str]:
        out = list(argv)
        for flag, value in zip(pairs[::2], pairs[1::2], strict=True):
            if str(flag) in out:
                out[out.index(str(flag)) + 1] = str(value)
            else:
                out += [str(flag), str(value)]
        return out

    return edit


def _spec(kind: str) -> Callable[[list[str]], list[str]]:
    def edit(argv: list[str]) -> list[str]:
        out = list(argv)
        for flag in [a for a in out if a.startswith("--spec-ngram-mod-")]:
            out = _drop(out, flag)
        out = _drop(out, "--spec-type")
        return [*out, "--spec-type", kind]

    return edit


# -- measuring one variant -----------------------------------------------------------------------------------


def _measure(v: Variant, launch: Launch, args: argparse.Namespace, *, quick: bool = False) -> Result:
    result = Result(
        v.name, v.changed, list(v.argv or launch.argv), predicted_tokens_per_s=v.predicted_tokens_per_s
    )
    _log(f"{v.name}: starting")
    began = time.perf_counter()
    try:
        with _server(v, launch, args) as engine:
            result.load_s = time.perf_counter() - began
            process = engine.process
            assert process is not None and process.pid is not None
            with _gpu_peak(process.pid) as gpu:
                for _ in range(1 if quick else args.rounds):
                    _one_round(engine, args, result, quick=quick)
                result.peak_rss_bytes = _peak_rss(process.pid)
            result.peak_gpu_bytes = gpu[0]
    except Exception as exc:  # a variant that fails is reported, the others still run
        result.error = f"{type(exc).__name__}: {exc}"
        _log(f"{v.name}: {result.error}")
    return result


@contextmanager
def _server(v: Variant, launch: Launch, args: argparse.Namespace) -> Iterator[LlamaServerEngine]:
    if v.argv is None:  # the product: exactly as chat and serve open it
        opened = open_launch(launch, ready_timeout_s=args.ready_timeout_s)
        engine = opened.engine
        assert isinstance(engine, LlamaServerEngine)
    else:
        from clover_local.launch import chat_template

        process: LlamaServerProcess = start_llama_server(
            list(v.argv), binary=launch.runner.binary, adapt=False, ready_timeout_s=args.ready_timeout_s
        )
        engine = LlamaServerEngine(
            process,
            model_name=launch.preset.name,
            sampling=launch.preset.sampling,
            template=chat_template(launch),
            slots=1,
        )
    try:
        yield engine
    finally:
        engine.close()


def _one_round(
    engine: LlamaServerEngine, args: argparse.Namespace, result: Result, *, quick: bool = False
) -> None:
    """One measurement of each figure; ``quick``: the first prompt size and decoding only."""
    n_ctx = engine.n_ctx
    per_word = engine.count_tokens(words(500)) / 500
    sizes = [x.strip() for x in args.prompts.split(",") if x.strip()]
    for asked in sizes[:1] if quick else sizes:
        size = min(int(asked), n_ctx - 64)
        text = words(int(size / per_word))
        stats = _run(
            engine, GenerationRequest(prompt=text, max_tokens=1, temperature=0.0, cache_prompt=False)
        )
        result.prompt_tokens[asked] = stats.prompt_tokens
        result.prompt_tokens_per_s.setdefault(asked, []).append(stats.prefill_tokens_per_s)
    code = CODE * max(1, min(12, (n_ctx // 4) // max(1, engine.count_tokens(CODE))))
    stats = _run(
        engine,
        GenerationRequest(
            prompt=code + CODE[:40], max_tokens=args.decode, temperature=0.0, cache_prompt=False
        ),
    )
    result.decode_tokens_per_s.append(stats.decode_tokens_per_s)
    result.decode_tokens = stats.completion_tokens
    result.draft_acceptance = stats.draft_acceptance
    if not quick:
        result.turn_s.append(_agent_turns(engine, args.turns, n_ctx))


BUSY = "beside a busy core"


@contextmanager
def _busy_program() -> Iterator[None]:
    """Another program that keeps one core busy (a Python loop), as a build or a browser tab would."""
    import subprocess

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(3.0)  # running before the launch is decided, so the machine's probe sees it
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _beside_a_busy_program(request: LaunchRequest, idle: Launch, args: argparse.Namespace) -> list[Result]:
    """Upstream's defaults (the command a person would type: the idle run's) and the launch decided again
    while another program keeps one core busy, each measured beside it (the first prompt size and decoding)."""
    out: list[Result] = []
    with _busy_program():
        busy = decide_launch(request)
        _log(f"beside a busy core the plan chose -t {busy.plan.threads}")
        plan = idle.plan
        upstream = ("-m", plan.model_path or "", "-c", str(plan.ctx * plan.parallel), "-t", str(plan.threads))
        for v, launch in (
            (Variant(f"{UPSTREAM}, {BUSY}", upstream, "the idle run's command, beside a busy core"), idle),
            (
                Variant(
                    f"{PRODUCT}, {BUSY}", None, "decided beside a busy core", busy.plan.predicted_tokens_per_s
                ),
                busy,
            ),
        ):
            out.append(
                _measure(v, launch, args, quick=True)
            )  # a busy core halves prompt speed: pp4000 takes long
            _log(_row(out[-1], out[0] if len(out) > 1 else None))
    return out


def _plain_decoding(results: list[Result]) -> Result:
    """The run whose decode speed is the plan's kind of figure: plain decoding (as llama-bench's ``tg``, which
    the planner's records hold), the launch with speculation off where it was measured, else the launch."""
    plain = next((r for r in results if r.name == "--spec-type none" and not r.error), None)
    return plain or next(r for r in results if r.name == PRODUCT)


def _record(launch: Launch, result: Result) -> None:
    """A measured decode speed at the launch's placement and threads as a speed record: plans on this machine
    then say "measured"."""
    import datetime

    from clover_local.measure.records import add_record
    from clover_local.plan.measured import SpeedRecord, machine_key, model_key

    if result.error or not result.decode_speed:
        _log("nothing recorded: the launch was not measured")
        return
    plan = launch.plan
    record = SpeedRecord(
        machine=machine_key(launch.machine),
        model=model_key(plan.quant, plan.file_bytes),
        n_gpu_layers=plan.n_gpu_layers,
        n_cpu_moe=plan.n_cpu_moe,
        tokens_per_s=round(result.decode_speed, 2),
        predicted_tokens_per_s=plan.estimated_tokens_per_s,
        tool="llama-server (bench_clover_full)",
        when=datetime.date.today().isoformat(),
        threads=plan.threads,
    )
    _log(f"recorded {record.tokens_per_s:.1f} tokens/s decode in {add_record(record)}")


def _agent_turns(engine: LlamaServerEngine, turns: int, n_ctx: int) -> list[float]:
    """A conversation that grows by a tool result each turn (as an agent's does), each reply capped at 48
    tokens, the cache reused as the product reuses it: the time of each turn."""
    chunk = CODE * 6  # ~400 tokens
    messages: list[ChatMessage] = [ChatMessage("system", "You are a coding agent. Answer briefly.")]
    times: list[float] = []
    for turn in range(turns):
        messages.append(ChatMessage("user", f"Tool result {turn}:\n{chunk}\nWhat changed?"))
        if engine.count_tokens("\n".join(m.content for m in messages)) + 128 > n_ctx:
            break
        began = time.perf_counter()
        reply = []
        for event in engine.generate(
            GenerationRequest(messages=tuple(messages), max_tokens=48, temperature=0.0)
        ):
            text = getattr(event, "text", None)
            if text:
                reply.append(text)
        times.append(time.perf_counter() - began)
        messages.append(ChatMessage("assistant", "".join(reply) or "ok"))
    return times


def _run(engine: LlamaServerEngine, request: GenerationRequest) -> GenerationStats:
    for event in engine.generate(request):
        if isinstance(event, Finished):
            return event.stats
    raise RuntimeError("the reply ended without its statistics")


def _peak_rss(pid: int) -> int:
    """The kernel's high-water mark of the process's resident memory (Linux), else its resident memory now."""
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


@contextmanager
def _gpu_peak(pid: int) -> Iterator[list[int]]:
    """The most GPU memory ``pid`` held while the block ran (NVML, sampled), 0 without an NVIDIA GPU."""
    from clover_local.measure.gpu_memory import nvml_or_none, process_gpu_bytes

    peak = [0]
    nvml = nvml_or_none()
    if nvml is None:
        yield peak
        return
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            with suppress(Exception):
                peak[0] = max(peak[0], process_gpu_bytes(nvml, pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()
        with suppress(Exception):
            peak[0] = max(peak[0], process_gpu_bytes(nvml, pid))


# -- the report -----------------------------------------------------------------------------------------------


def _row(r: Result, upstream: Result | None) -> str:
    if r.error:
        return f"{r.name}: FAILED ({r.error})"
    prompts = ", ".join(
        f"{r.prompt_tokens.get(k, 0)} tokens {r.prompt_speed(k):.1f} t/s" for k in r.prompt_tokens_per_s
    )
    turn = f"{r.last_turn_s:.2f} s" if r.turn_s else "-"
    ratio = ""
    if upstream is not None and upstream is not r and not upstream.error and upstream.decode_speed:
        ratio = f" ({r.decode_speed / upstream.decode_speed:.2f}x upstream)"
    return (
        f"{r.name}: load {r.load_s:.1f} s; prompt {prompts}; decode {r.decode_speed:.1f} t/s{ratio}; "
        f"last agent turn {turn}; peak RSS {r.peak_rss_bytes / 2**30:.2f} GiB"
        + (f", GPU {r.peak_gpu_bytes / 2**30:.2f} GiB" if r.peak_gpu_bytes else "")
    )


def _report(launch: Launch, results: list[Result], skipped: list[str]) -> str:
    plan = launch.plan
    idle_upstream = next((r for r in results if r.name == UPSTREAM and not r.error), None)
    lines = [
        f"Model {plan.model_path} ({plan.quant}, {plan.file_bytes / 2**30:.1f} GiB); runtime "
        f"{launch.runner.runtime or launch.runner.binary}; context {plan.ctx}, threads {plan.threads}",
        f"Plan: -ngl {plan.n_gpu_layers} --n-cpu-moe {plan.n_cpu_moe}, predicted decode "
        f"{plan.predicted_tokens_per_s:.1f} t/s, RAM {plan.memory.ram.used_bytes / 2**30:.2f} GiB"
        + "".join(f", {g.name} {g.used_bytes / 2**30:.2f} GiB" for g in plan.memory.gpus),
        "",
    ]
    sizes = sorted({k for r in results for k in r.prompt_tokens_per_s}, key=int)
    head = [
        "variant",
        "load s",
        *(f"pp{s} t/s" for s in sizes),
        "decode t/s",
        "predicted",
        "turn s",
        "RSS GiB",
        "GPU GiB",
    ]
    rows = [head]
    busy_upstream = next((r for r in results if r.name == f"{UPSTREAM}, {BUSY}" and not r.error), None)
    for r in results:
        upstream = busy_upstream if r.name.endswith(BUSY) else idle_upstream
        if r.error:
            rows.append([r.name, "failed", *([""] * (len(head) - 2))])
            continue
        cells = [r.name, f"{r.load_s:.1f}"]
        cells += [
            _with_ratio(r.prompt_speed(s), upstream.prompt_speed(s) if upstream else 0.0)
            if s in r.prompt_tokens_per_s
            else "-"  # not measured (--grid-quick, --busy)
            for s in sizes
        ]
        cells.append(_with_ratio(r.decode_speed, upstream.decode_speed if upstream else 0.0))
        cells.append(f"{r.predicted_tokens_per_s:.1f}" if r.predicted_tokens_per_s else "-")
        cells.append(
            _with_ratio(r.last_turn_s, upstream.last_turn_s if upstream else 0.0, fmt="{:.2f}")
            if r.turn_s
            else "-"
        )
        cells.append(
            _with_ratio(
                r.peak_rss_bytes / 2**30, upstream.peak_rss_bytes / 2**30 if upstream else 0.0, fmt="{:.2f}"
            )
        )
        cells.append(f"{r.peak_gpu_bytes / 2**30:.2f}" if r.peak_gpu_bytes else "-")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines += [
        "",
        "(x: ratio to upstream's defaults, idle or beside the busy core; load, turn and RSS: lower is better)",
    ]
    for r in results:
        if r.error:
            lines.append(f"{r.name} failed: {r.error}")
    lines += [f"not measured: {s}" for s in skipped]
    return "\n".join(lines)


def _with_ratio(value: float, base: float, fmt: str = "{:.1f}") -> str:
    text = fmt.format(value)
    return f"{text} ({value / base:.2f}x)" if base else text


def _write(path: Path, launch: Launch, results: list[Result], skipped: list[str]) -> None:
    plan = launch.plan
    data: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": plan.model_path,
        "runtime": launch.runner.runtime,
        "command": launch.command,
        "plan": {
            "ctx": plan.ctx,
            "threads": plan.threads,
            "n_gpu_layers": plan.n_gpu_layers,
            "n_cpu_moe": plan.n_cpu_moe,
            "predicted_tokens_per_s": plan.predicted_tokens_per_s,
            "ram_bytes": plan.memory.ram.used_bytes,
            "gpu_bytes": plan.memory.gpu_bytes,
        },
        "results": [
            {
                **asdict(r),
                "prompt_speed": {k: r.prompt_speed(k) for k in r.prompt_tokens_per_s},
                "decode_speed": r.decode_speed,
                "last_turn_s": r.last_turn_s,
            }
            for r in results
        ],
        "skipped": skipped,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    sys.exit(main())
