"""``bench_serve.py --concurrency 1,2,4``: many requests at once, ``serve`` on each engine beside upstream
``llama-server -np N`` (same model, same threads, same context per slot), in one run.

For each N, every configuration gets N different chat requests at once (greedy, streamed, the same
``max_tokens``), ``--rounds`` times, rounds interleaved across configurations so a noisy machine slows all alike.
Figures per configuration: aggregate tokens/s (all completion tokens over the wall time from the first send to
the last reply's end; median over rounds) and each request's time to first token, p50 and p99 over all rounds.
Ratios are against upstream ``llama-server -np N`` at the same N.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

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


def _stream_chat(target: Target, topic: str, max_tokens: int, started: float) -> tuple[int, float]:
    """One streamed chat request: its completion tokens and its time to first token (from ``started``)."""
    host, port = target.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=900)
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": f"Write a short story about {topic}."}],
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


def one_round(target: Target, n: int, max_tokens: int) -> None:
    results: list[tuple[int, float]] = [(0, float("nan"))] * n
    started = time.perf_counter()

    def ask(i: int) -> None:
        results[i] = _stream_chat(target, TOPICS[i % len(TOPICS)], max_tokens, started)

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
    from clover_local.launch import LaunchRequest, decide_launch, open_launch
    from clover_local.llamacpp.binary import find_llama_server
    from clover_local.llamacpp.server import start_llama_server
    from clover_local.serve.api import ApiConfig
    from clover_local.serve.runner import BackgroundServer

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
                request = LaunchRequest(
                    preset=args.preset,
                    model=model,
                    ctx=args.ctx,
                    parallel=n,
                    engine=engine,
                    threads=args.threads,
                    describe=False,
                )
                launches[engine] = decide_launch(request)
            plan = launches["embedded"].plan
            report["threads"] = plan.threads
            if binary is not None:
                argv = ["-m", model, "-np", str(n), "-c", str(args.ctx * n), "-t", str(plan.threads)]
                argv += ["-tb", str(plan.threads)]
                upstream = start_llama_server(argv, binary=binary, adapt=False)
                stack.callback(upstream.stop)
                targets.append(Target(f"upstream llama-server -np {n}", upstream.url, upstream.api_key))
            for engine, launch in launches.items():
                opened = open_launch(launch)
                stack.callback(opened.engine.close)
                server = stack.enter_context(BackgroundServer(opened.engine, ApiConfig("bench-model")))
                targets.append(Target(f"serve --engine {engine} ({launch.plan.parallel} slots)", server.url))
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
