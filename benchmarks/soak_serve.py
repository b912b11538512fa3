#!/usr/bin/env python3
"""Soak ``clover-local serve``: agent-like load for a long while, with the llama-server child killed on the way,
and what the server process holds before and after (issue 39's reliability benchmark; not a test: no timing is
asserted, the figures go in docs/reliability.md).

For each engine (``--engines embedded,llama-server``) ``clover-local serve`` runs as its own process, as people
run it, and ``--clients`` threads send requests back to back for ``--minutes``: streamed and whole chat replies,
tool calls with a schema (``tool_choice`` required), ``response_format`` JSON schemas, streams the client
cancels after a few chunks, and hang-ups (a request whose client leaves before the reply). A 503 with
``Retry-After`` is retried as the official clients retry it (at most 3 times). On the llama-server engine the
child is killed with SIGKILL ``--kills`` times, spread over the run.

It reports requests answered, errors by status, requests *lost* (ended in an error, not in flight at a kill:
should be 0), restarts (``/health``), and the serve process's resident memory (its children included), open files,
threads and children: after the warm-up (the first sample past ``--warmup`` minutes), at their peak and at the
end, and after the process stopped, any llama-server left behind (orphans).

    .venv/bin/python benchmarks/soak_serve.py [--preset smollm2-135m] [--minutes 30] [--clients 4] [--kills 2]
        [--engines embedded,llama-server] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOPICS = ("the sea", "a lighthouse", "bread", "a bicycle", "the moon", "a library", "rain", "a market")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
KINDS = ("stream", "whole", "tool", "schema", "cancel", "hangup")


@dataclass
class Outcome:
    kind: str
    started: float
    ended: float
    status: int | str
    """The HTTP status of the last try, or a word for a transport failure ("reset", "timeout")."""
    retries: int = 0
    ok: bool = False
    detail: dict[str, Any] | None = None
    """For a 200 that was not the answer asked for: the request and the reply, kept to say why."""


@dataclass
class Sample:
    at_s: float
    rss_mib: float
    open_files: int
    threads: int
    children: int


@dataclass
class SoakResult:
    engine: str
    minutes: float
    requests: int
    answered: int
    by_status: dict[str, int]
    by_kind: dict[str, int]
    lost: int
    in_flight_at_kills: int
    kills: int
    restarts: int
    retried_503: int
    samples: list[Sample] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)
    unexpected: list[dict[str, Any]] = field(default_factory=list)
    """Each 200 that was not the answer asked for (a tool call missing, JSON not of the schema): request, reply."""
    log: str = ""
    """serve's own log (its terminal) for the run."""

    def figure(self, what: str) -> tuple[float, float, float]:
        """(after the warm-up, peak, end) of one sampled figure."""
        values = [getattr(s, what) for s in self.samples]
        return (values[0], max(values), values[-1]) if values else (0.0, 0.0, 0.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(port: int, method: str, path: str, body: dict[str, Any] | None, timeout_s: float = 600.0) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    conn.request(method, path, json.dumps(body) if body else None, {"Content-Type": "application/json"})
    return conn, conn.getresponse()


MODEL = ["model"]
"""The name the server answers to (read from its ``/v1/models`` once it is up)."""


def _body(kind: str, rng: random.Random) -> dict[str, Any]:
    topic = rng.choice(TOPICS)
    messages = [{"role": "user", "content": f"Write two sentences about {topic}."}]
    body: dict[str, Any] = {"model": MODEL[0], "messages": messages, "max_tokens": 64, "temperature": 0.7}
    if kind in ("stream", "cancel"):
        body["stream"] = True
        body["max_tokens"] = 160
    elif kind in ("tool", "schema"):
        body["max_tokens"] = 160
    if kind == "tool":
        body["messages"] = [{"role": "user", "content": f"What is the weather near {topic}?"}]
        body["tools"] = [WEATHER_TOOL]
        body["tool_choice"] = "required"
    elif kind == "schema":
        body["messages"] = [{"role": "user", "content": f"A person who loves {topic}, as JSON."}]
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
        }
    return body


def _one(port: int, kind: str, rng: random.Random) -> tuple[int | str, bool, dict[str, Any] | None]:
    """One request of ``kind``: its status, whether it got a whole answer (a cancel or a hang-up that was
    accepted counts as answered: the client chose to leave), and for a 200 that was not the answer asked for,
    the request and the reply."""
    if kind == "hangup":  # the client sends its request, then leaves before any reply
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            payload = json.dumps(_body("whole", rng)).encode()
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            )
            s.sendall(head.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        return 200, True, None
    body = _body(kind, rng)
    conn, resp = _request(port, "POST", "/v1/chat/completions", body)
    try:
        if resp.status != 200:
            resp.read()
            return resp.status, False, None
        if kind in ("stream", "cancel"):
            chunks, errored, done = 0, False, False
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunks += 1
                errored = errored or '"error"' in line[:40]
                if kind == "cancel" and chunks >= 4:
                    return 200, True, None  # the client leaves mid-stream: conn.close() below hangs up
            if errored:
                return "stream-error", False, None
            return (200, True, None) if done else ("stream without its end", False, None)
        data = json.loads(resp.read())
        if data["choices"][0].get("finish_reason") == "length":
            return "200 cut at max_tokens", True, None  # answered as asked: the reply reached its token limit
        choice = data["choices"][0]["message"]
        detail = {"request": body, "reply": data}
        if kind == "tool":
            return (200, True, None) if choice.get("tool_calls") else ("200 without a call", False, detail)
        if kind == "schema":
            try:
                parsed = json.loads(choice["content"])
            except ValueError:
                return "200 not JSON", False, detail
            valid = isinstance(parsed, dict) and {"name", "age"} <= set(parsed)
            return (200, True, None) if valid else ("200 not the schema", False, detail)
        return 200, True, None
    finally:
        conn.close()


def _client(port: int, stop: threading.Event, seed: int, out: list[Outcome], lock: threading.Lock) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        kind = rng.choice(KINDS)
        started = time.monotonic()
        retries = 0
        while True:
            detail = None
            try:
                status, ok, detail = _one(port, kind, rng)
            except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
                status, ok = type(exc).__name__, False
            if status == 503 and retries < 3 and not stop.is_set():
                retries += 1
                time.sleep(2.0)  # Retry-After, as the official clients honour it
                continue
            break
        with lock:
            out.append(Outcome(kind, started, time.monotonic(), status, retries, ok, detail))


def _sample(proc: psutil.Process, t0: float) -> Sample:
    procs = [proc, *proc.children(recursive=True)]
    rss = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
    return Sample(
        round(time.monotonic() - t0, 1),
        round(rss / 2**20, 1),
        proc.num_fds(),
        proc.num_threads(),
        len(proc.children(recursive=True)),
    )


def _llama_children(proc: psutil.Process) -> list[psutil.Process]:
    return [c for c in proc.children(recursive=True) if "llama-server" in c.name()]


def soak(engine: str, args: argparse.Namespace) -> SoakResult:
    port = _free_port()
    argv = [sys.executable, "-m", "clover_local", "serve", "--preset", args.preset, "--engine", engine]
    argv += ["--port", str(port), "--ctx", str(args.ctx)]
    log = tempfile.NamedTemporaryFile(prefix=f"soak-{engine}-", suffix=".log", delete=False)  # noqa: SIM115
    server = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    ps = psutil.Process(server.pid)
    child_pids: set[int] = set()
    deadline = time.monotonic() + 600
    while True:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn, resp = _request(port, "GET", "/health", None, timeout_s=2)
            resp.read()
            conn.close()
            if resp.status == 200:
                conn, resp = _request(port, "GET", "/v1/models", None, timeout_s=10)
                MODEL[0] = str(json.loads(resp.read())["data"][0]["id"])
                conn.close()
                break
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"serve did not start ({engine}); its log: {log.name}")
        time.sleep(0.5)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.monotonic()
    clients = [
        threading.Thread(target=_client, args=(port, stop, seed, outcomes, lock), daemon=True)
        for seed in range(args.clients)
    ]
    for c in clients:
        c.start()
    duration = args.minutes * 60
    kills = args.kills if engine == "llama-server" else 0
    kill_at = [duration * (i + 1) / (kills + 1) for i in range(kills)]
    kill_times: list[float] = []
    samples: list[Sample] = []
    next_sample = args.warmup * 60
    while (now := time.monotonic() - t0) < duration:
        child_pids.update(c.pid for c in _llama_children(ps))
        if kill_at and now >= kill_at[0]:
            kill_at.pop(0)
            for child in _llama_children(ps):
                with contextlib.suppress(psutil.Error):
                    child.send_signal(signal.SIGKILL)
                    kill_times.append(time.monotonic())
                    print(f"[{engine}] killed llama-server {child.pid} at {now:.0f} s", file=sys.stderr)
        if now >= next_sample:
            samples.append(_sample(ps, t0))
            next_sample += args.sample_every
        time.sleep(1.0)
    stop.set()
    for c in clients:
        c.join(timeout=600)
    samples.append(_sample(ps, t0))
    restarts = 0
    with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
        conn, resp = _request(port, "GET", "/health", None, timeout_s=10)
        restarts = int(json.loads(resp.read()).get("restarts", 0))
        conn.close()
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    time.sleep(2.0)
    orphans = [
        pid for pid in child_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
    ]
    in_flight = [o for o in outcomes if any(o.started <= k <= o.ended for k in kill_times)]
    lost = [o for o in outcomes if not o.ok and o not in in_flight]
    return SoakResult(
        engine=engine,
        minutes=args.minutes,
        requests=len(outcomes),
        answered=sum(o.ok for o in outcomes),
        by_status=dict(Counter(str(o.status) for o in outcomes)),
        by_kind=dict(Counter(o.kind for o in outcomes)),
        lost=len(lost),
        in_flight_at_kills=len(in_flight),
        kills=len(kill_times),
        restarts=restarts,
        retried_503=sum(o.retries for o in outcomes),
        samples=samples,
        orphans=orphans,
        unexpected=[o.detail for o in outcomes if o.detail is not None],
        log=log.name,
    )


def table(results: list[SoakResult]) -> str:
    rows = [
        "| engine | minutes | requests | answered | lost | in flight at a kill | kills / restarts | 503 retried |"
        " RSS MiB (warm / peak / end) | open files | threads | children |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        rss = "{:.0f} / {:.0f} / {:.0f}".format(*r.figure("rss_mib"))
        files = "{:.0f} / {:.0f} / {:.0f}".format(*r.figure("open_files"))
        threads = "{:.0f} / {:.0f} / {:.0f}".format(*r.figure("threads"))
        children = "{:.0f} / {:.0f} / {:.0f}".format(*r.figure("children"))
        rows.append(
            f"| {r.engine} | {r.minutes:g} | {r.requests} | {r.answered} | {r.lost} | {r.in_flight_at_kills} | "
            f"{r.kills} / {r.restarts} | {r.retried_503} | {rss} | {files} | {threads} | {children} |"
        )
    for r in results:
        rows.append(
            f"\n{r.engine}: by status {r.by_status}; by kind {r.by_kind}; orphans {r.orphans or 'none'}; "
            f"serve's log {r.log}"
        )
        for d in r.unexpected:
            reply = d["reply"]["choices"][0]
            rows.append(
                f"  not as asked: finish {reply.get('finish_reason')!r}, "
                f"content {str(reply['message'].get('content'))[:400]!r}"
            )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=2.0, help="minutes before the first sample")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs of the llama-server child")
    parser.add_argument("--engines", default="embedded,llama-server")
    parser.add_argument("--parallel-engines", action="store_true", help="soak the engines at the same time")
    parser.add_argument("--json", metavar="OUT", help="write every figure and sample here")
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    results: list[SoakResult] = []
    if args.parallel_engines:
        slots: dict[str, SoakResult] = {}
        threads = [threading.Thread(target=lambda e=e: slots.__setitem__(e, soak(e, args))) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [slots[e] for e in engines if e in slots]
    else:
        results = [soak(e, args) for e in engines]
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if all(r.lost == 0 and not r.orphans for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
