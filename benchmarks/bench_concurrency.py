"""``bench_serve.py --concurrency 1,2,4``: many requests at once, ``serve`` on each engine beside upstream
``llama-server -np N`` (same model, same threads, same context per slot), in one run.

For each N, every configuration gets N different chat requests at once (greedy, streamed, the same
``max_tokens``), ``--rounds`` times, rounds interleaved across configurations so a noisy machine slows all alike.
Figures per configuration: aggregate tokens/s (all completion tokens over the wall time from the first send to
the last reply's end; median over rounds) and each request's time to first token, p50 and p99 over all rounds.
Ratios are against upstream ``llama-server -np N`` at the same N.

``serve`` runs as its own process (``clover-local serve``, as a person runs it), never inside the benchmark:
the clients' own Python (parsing four streams of events) would otherwise share the server's interpreter and
cores, which upstream llama-server, a process of its own, never pays (measured on 2 cores with a tiny model:
1238 tokens/s in the benchmark's process, against 2000 for the engine without HTTP).

Then one request alone (issue 30: slots must not slow it down): ``serve`` with its default slots beside
``serve`` with one slot (what it was before slots), on each engine, for a story (nothing to copy) and a code
rename (what speculation is for), rounds interleaved; decode tokens/s (after the first token), medians.
"""

from __future__ import annotations

import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

TOPICS = (
    "a lighthouse",
    "a bicycle",
    "the moon",
    "a library",
    "a volcano",
    "a violin",
    "a garden",
    "a train",
)


@dataclass
class Target:
    name: str
    url: str
    api_key: str | None = None
    model: str = "bench-model"
    rounds: list[tuple[float, int, list[float]]] = field(default_factory=list)
    """(wall seconds, completion tokens, time to first token of each request) per round."""


def _stream_chat(target: Target, content: str, max_tokens: int, started: float) -> tuple[int, float]:
    """One streamed chat request: its completion tokens and its time to first token (from ``started``)."""
    host, port = target.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=900)
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Content-Type": "application/json"}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{target.name}: HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft = float("nan")
    tokens = 0
    try:
        for raw in resp:
            line = raw.decode().strip()
            if line.endswith("[DONE]"):
                break  # the reply is complete: do not wait for the server to close the connection
            if not line.startswith("data:"):
                continue
            chunk = json.loads(line[5:])
            delta = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if delta and ttft != ttft:
                ttft = time.perf_counter() - started
            usage = chunk.get("usage")
            if usage:
                tokens = int(usage.get("completion_tokens") or 0)
    finally:
        conn.close()
    return tokens, ttft


def _launch(args: Any, model: str, engine: str, parallel: int | None) -> Any:
    """The launch ``serve`` decides for these options (its default slots when ``parallel`` is None)."""
    from clover_local.launch import LaunchRequest, decide_launch

    request = LaunchRequest(
        preset=args.preset,
        model=model,
        ctx=args.ctx,
        parallel=parallel,
        engine=engine,
        threads=args.threads,
        describe=False,
    )
    return decide_launch(request)


@contextmanager
def serve_process(args: Any, model: str, engine: str, parallel: int | None) -> Iterator[tuple[str, str]]:
    """``clover-local serve`` in a process of its own (its default slots when ``parallel`` is None): its URL and
    the model name it serves, once ``/health`` answers; stopped on exit."""
    from clover_local.llamacpp.server import free_port

    port = free_port()
    argv = [sys.executable, "-m", "clover_local", "serve", "--model", model, "--engine", engine]
    argv += ["--port", str(port), "--ctx", str(args.ctx)]
    argv += ["--parallel", str(parallel)] if parallel is not None else []
    argv += ["--preset", args.preset] if getattr(args, "preset", None) else []
    argv += ["--threads", str(args.threads)] if getattr(args, "threads", None) else []
    argv += ["--llama-server", args.llama_server] if getattr(args, "llama_server", None) else []
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        model_id = _wait_until_serving(proc, port, log)
        yield f"http://127.0.0.1:{port}", model_id
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_until_serving(
    proc: subprocess.Popen[bytes], port: int, log: IO[bytes], timeout_s: float = 600.0
) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            err = log.read().decode(errors="replace")
            raise SystemExit(f"clover-local serve exited ({proc.returncode}):\n{err[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            if resp.status == 200:
                return str(json.loads(body)["data"][0]["id"])
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.25)
    raise SystemExit(f"clover-local serve did not answer on port {port} within {timeout_s:.0f} s")


def one_round(target: Target, n: int, max_tokens: int) -> None:
    results: list[tuple[int, float]] = [(0, float("nan"))] * n
    started = time.perf_counter()

    def ask(i: int) -> None:
        topic = TOPICS[i % len(TOPICS)]
        results[i] = _stream_chat(target, f"Write a short story about {topic}.", max_tokens, started)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    target.rounds.append((wall, sum(r[0] for r in results), [r[1] for r in results]))


def _percentile(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summarize(targets: list[Target]) -> list[dict[str, Any]]:
    rows = []
    for t in targets:
        agg = statistics.median(tokens / wall for wall, tokens, _ in t.rounds)
        ttfts = [x for _, _, r in t.rounds for x in r]
        rows.append(
            {
                "name": t.name,
                "aggregate_tps": agg,
                "ttft_p50_s": _percentile(ttfts, 0.5),
                "ttft_p99_s": _percentile(ttfts, 0.99),
                "tokens_per_round": [tokens for _, tokens, _ in t.rounds],
            }
        )
    base = rows[0]["aggregate_tps"] if rows and rows[0]["name"].startswith("upstream") else None
    for row in rows:
        row["ratio"] = row["aggregate_tps"] / base if base else None
    return rows


def run_concurrency(args: Any, model: str, levels: list[int]) -> dict[str, Any]:
    """Open, for each N, upstream ``llama-server -np N`` and ``serve`` with N slots on each engine; measure."""
    from clover_local.llamacpp.binary import find_llama_server
    from clover_local.llamacpp.server import start_llama_server

    binary = find_llama_server(getattr(args, "llama_server", None))
    report: dict[str, Any] = {
        "model": model,
        "levels": {},
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
    }
    for n in levels:
        with ExitStack() as stack:
            targets: list[Target] = []
            engines = ["embedded", *(["llama-server"] if binary is not None else [])]
            launches = {}
            for engine in engines:
                launches[engine] = _launch(args, model, engine, n)
            plan = launches["embedded"].plan
            report["threads"] = plan.threads
            if binary is not None:
                argv = ["-m", model, "-np", str(n), "-c", str(args.ctx * n), "-t", str(plan.threads)]
                argv += ["-tb", str(plan.threads)]
                upstream = start_llama_server(argv, binary=binary, adapt=False)
                stack.callback(upstream.stop)
                targets.append(Target(f"upstream llama-server -np {n}", upstream.url, upstream.api_key))
            for engine, launch in launches.items():
                url, model_id = stack.enter_context(serve_process(args, model, engine, n))
                targets.append(
                    Target(f"serve --engine {engine} ({launch.plan.parallel} slots)", url, model=model_id)
                )
            for t in targets:  # warm-up
                one_round(t, 1, 8)
                t.rounds.clear()
            for _ in range(args.rounds):
                for t in targets:
                    one_round(t, n, args.max_tokens)
            report["levels"][n] = summarize(targets)
            for row in report["levels"][n]:  # progress on stderr: a long run says what it has so far
                print(
                    f"N={n} {row['name']}: {row['aggregate_tps']:.1f} tokens/s", file=sys.stderr, flush=True
                )
    return report


def lone_prompts() -> dict[str, str]:
    from _serve_bench import ORDERS_SOURCE

    return {
        "story": "Write a short story about a lighthouse.",
        "code rename": (
            f"Original file:\n```python\n{ORDERS_SOURCE}```\n\nWrite the same file after renaming Order to "
            "Invoice."
        ),
    }


def run_lone(args: Any, model: str) -> list[dict[str, Any]]:
    """One request at a time: ``serve`` with its default slots beside ``serve`` with one, on each engine."""
    from clover_local.llamacpp.binary import find_llama_server

    binary = find_llama_server(getattr(args, "llama_server", None))
    engines = ["embedded", *(["llama-server"] if binary is not None else [])]
    prompts = lone_prompts()
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        targets: dict[tuple[str, str], Target] = {}
        for engine in engines:
            for slots, parallel in (("1 slot", 1), ("default", None)):
                launch = _launch(args, model, engine, parallel)
                url, model_id = stack.enter_context(serve_process(args, model, engine, parallel))
                label = f"{launch.plan.parallel} slots" if parallel is None else slots
                targets[(engine, slots)] = Target(f"serve --engine {engine} ({label})", url, model=model_id)
        speeds: dict[tuple[str, str, str], list[float]] = {}
        for t in targets.values():  # warm-up
            _stream_chat(t, "Hello.", 8, time.perf_counter())
        for _ in range(args.rounds):
            for prompt, content in prompts.items():
                for (engine, slots), t in targets.items():
                    started = time.perf_counter()
                    tokens, ttft = _stream_chat(t, content, args.max_tokens, started)
                    decode_s = time.perf_counter() - started - ttft
                    if tokens > 1 and decode_s > 0:
                        speeds.setdefault((engine, prompt, slots), []).append((tokens - 1) / decode_s)
        for engine in engines:
            for prompt in prompts:
                one = statistics.median(speeds[(engine, prompt, "1 slot")])
                default = statistics.median(speeds[(engine, prompt, "default")])
                rows.append(
                    {
                        "engine": engine,
                        "prompt": prompt,
                        "default_name": targets[(engine, "default")].name,
                        "one_slot_tps": one,
                        "default_tps": default,
                        "ratio": default / one,
                    }
                )
                print(
                    f"lone {engine} {prompt}: {default:.1f} / {one:.1f} tokens/s", file=sys.stderr, flush=True
                )
    return rows


def print_lone(rows: list[dict[str, Any]]) -> None:
    print("\none request alone: serve with its default slots / serve with one slot (decode tokens/s)")
    print(f"{'engine':<13} {'prompt':<12} {'default slots':>14} {'1 slot':>8} {'ratio':>6}")
    for r in rows:
        print(
            f"{r['engine']:<13} {r['prompt']:<12} {r['default_tps']:>14.1f} {r['one_slot_tps']:>8.1f}"
            f" {r['ratio']:>5.2f}x"
        )


def print_report(report: dict[str, Any]) -> None:
    print(
        f"model {report['model']}, {report.get('threads')} threads, {report['max_tokens']} tokens per request, "
        f"{report['rounds']} rounds (medians; TTFT over every request)"
    )
    print(
        f"{'N':>3} {'configuration':<44} {'aggregate t/s':>13} {'ratio':>6} {'TTFT p50':>9} {'TTFT p99':>9}"
    )
    for n, rows in report["levels"].items():
        for r in rows:
            ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
            print(
                f"{n:>3} {r['name']:<44} {r['aggregate_tps']:>13.1f} {ratio:>6} {r['ttft_p50_s']:>8.2f}s"
                f" {r['ttft_p99_s']:>8.2f}s"
            )


def print_plot(report: dict[str, Any], width: int = 50) -> None:
    """Aggregate tokens/s as text bars, one per configuration and N (what the docs show)."""
    rows = [(n, r) for n, level in report["levels"].items() for r in level]
    top = max((r["aggregate_tps"] for _, r in rows), default=1.0) or 1.0
    print("\naggregate tokens/s")
    for n, r in rows:
        bar = "#" * max(1, round(width * r["aggregate_tps"] / top))
        print(f"N={n:<2} {r['name'][:34]:<34} {bar} {r['aggregate_tps']:.1f}")
