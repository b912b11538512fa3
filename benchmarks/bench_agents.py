#!/usr/bin/env python3
"""Agent steps through ``clover-local serve``: tokens/s and seconds per step, with and without self-speculation,
side by side in one run.

Workload: a coding agent's two steps over the same growing context, greedy, through ``/v1/chat/completions``
with ``tools``:
  1. "rename X to Y": a forced ``write_file(path, content)`` call whose content is the file from the prompt,
     renamed (the copy that n-gram drafting is made for; the grammar keeps the call well-formed);
  2. the tool result fed back, then a short text answer (``tool_choice: none``).
Both configurations are served at once and the rounds interleaved (one agent run per configuration per round),
so a noisy shared machine slows both alike; figures are medians over rounds.

Configurations: ``serve`` on the embedded engine, speculation on and off; on the llama-server engine too when a
binary is found (a template without tool syntax, like Gemma's built-in one, gets the generic tool format there
as on the embedded engine).

    .venv/bin/python benchmarks/bench_agents.py [--preset gemma3-270m] [--rounds 3] [--json]

The agent loop (``--loop GGUF...``, issue 28): ``--turns`` turns of a session that grows by a tool call and a
few hundred tokens of tool result per turn, sent whole every turn (as agents do), on each GGUF, the embedded
engine and llama-server side by side at the same threads and context checkpoints; per turn the prompt tokens
each evaluated (the rest came from its cache), TTFT and decode speed. On a hybrid model without checkpoints
every turn would evaluate the whole prompt again.

    .venv/bin/python benchmarks/bench_agents.py --loop SmolLM2.gguf tiny-qwen35moe.gguf [--turns 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _serve_bench import BENCH_MODEL, ORDERS_HEAD, post, reply_figures

WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write the whole new content of a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "enum": ["orders.py"]}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
}
ASK = f"Here is orders.py:\n```python\n{ORDERS_HEAD}```\nRename the function unpaid_orders to open_orders and write the file."


@dataclass
class Config:
    name: str
    url: str
    steps: list[list[dict[str, float]]] = field(default_factory=list)


def _post(cfg: Config, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    return post(cfg.url, "/v1/chat/completions", body, name=cfg.name)


def agent_run(cfg: Config, max_tokens: int) -> list[dict[str, float]]:
    """Both steps of one agent run; the figures of each."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    common = {"model": BENCH_MODEL, "temperature": 0, "tools": [WRITE_FILE]}
    data, wall = _post(
        cfg, {**common, "messages": messages, "tool_choice": "required", "max_tokens": max_tokens}
    )
    first = reply_figures(data, wall)
    message = data["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    first["complete_call"] = float(bool(calls))
    if calls:
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "wrote orders.py (ok)"})
    else:  # cut by max_tokens before the call closed: the next step still runs on the same context
        messages.append({"role": "assistant", "content": message.get("content") or ""})
        messages.append({"role": "user", "content": "The file was written."})
    data, wall = _post(cfg, {**common, "messages": messages, "tool_choice": "none", "max_tokens": 48})
    return [first, reply_figures(data, wall)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gemma3-270m")
    parser.add_argument("--model", help="a local GGUF (default: the preset's)")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--loop",
        metavar="GGUF",
        nargs="+",
        help="instead: the agent loop on these GGUFs (an attention model and a hybrid one), both engines",
    )
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.loop:
        loops = {m: agent_loop(m, args.turns, 32, 8192, args.threads) for m in args.loop}
        if args.json:
            print(json.dumps(loops, indent=2))
        for m, rows in loops.items():
            print_loop(Path(m).name, rows)
        return 0

    from clover_local.launch import LaunchRequest, decide_launch, open_launch
    from clover_local.llamacpp.binary import find_llama_server
    from clover_local.model_files import require_model
    from clover_local.presets import load_preset
    from clover_local.serve.api import ApiConfig
    from clover_local.serve.runner import BackgroundServer

    model = str(require_model(None if args.model else load_preset(args.preset), args.model))
    request = LaunchRequest(args.preset, model, ctx=args.ctx)
    engines: list[tuple[str, LaunchRequest]] = [
        ("embedded, speculation on", replace(request, engine="embedded")),
        ("embedded, speculation off", replace(request, engine="embedded", spec="off")),
    ]
    skipped = None
    if find_llama_server() is None:
        skipped = "no llama-server found"
    else:
        engines += [
            ("llama-server, speculation on", replace(request, engine="llama-server")),
            ("llama-server, speculation off", replace(request, engine="llama-server", spec="off")),
        ]
    configs: list[Config] = []
    with ExitStack() as stack:
        for name, wanted in engines:
            opened = open_launch(decide_launch(wanted))
            stack.callback(opened.engine.close)
            server = BackgroundServer(opened.engine, ApiConfig(BENCH_MODEL))
            stack.enter_context(server)
            configs.append(Config(name, server.url))
        for cfg in configs:  # warm-up: page in weights
            agent_run(cfg, 32)
        for _ in range(args.rounds):
            for cfg in configs:
                cfg.steps.append(agent_run(cfg, args.max_tokens))
    report = summarize(configs)
    report["model"] = Path(model).name
    report["threads"] = opened.plan.threads
    report["llama_server_skipped"] = skipped
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def summarize(configs: list[Config]) -> dict[str, Any]:
    rows = []
    for cfg in configs:
        row: dict[str, Any] = {"name": cfg.name}
        for i, step in enumerate(("call", "answer")):
            runs = [r[i] for r in cfg.steps]
            row[step] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        row["agent_run_seconds"] = statistics.median(sum(s["seconds"] for s in r) for r in cfg.steps)
        rows.append(row)
    by_name = {r["name"]: r for r in rows}
    for row in rows:
        off = by_name.get(row["name"].replace("speculation on", "speculation off"))
        if off is not None and off is not row:
            row["speedup_call_tps"] = row["call"]["decode_tps"] / off["call"]["decode_tps"]
            row["speedup_run_seconds"] = off["agent_run_seconds"] / row["agent_run_seconds"]
    return {"rounds": len(configs[0].steps) if configs else 0, "rows": rows}


def print_table(report: dict[str, Any]) -> None:
    print(f"model {report['model']}, {report['threads']} threads, {report['rounds']} rounds, medians")
    head = f"{'configuration':<32} {'call t/s':>8} {'call s':>7} {'accept':>7} {'answer s':>8} {'run s':>7} {'speed-up':>8}"
    print(head)
    for r in report["rows"]:
        acc = r["call"]["acceptance"]
        speedup = f"{r['speedup_run_seconds']:.2f}x" if "speedup_run_seconds" in r else "-"
        print(
            f"{r['name']:<32} {r['call']['decode_tps']:>8.1f} {r['call']['seconds']:>7.2f} "
            f"{'-' if acc != acc else f'{acc:.0%}':>7} {r['answer']['seconds']:>8.2f} {r['agent_run_seconds']:>7.2f} "
            f"{speedup:>8}"
        )
    if report["llama_server_skipped"]:
        print(f"(llama-server rows skipped: {report['llama_server_skipped']})")


# --- the agent loop (issue 28): a growing session, turn by turn, on both engines ---------------------------------

LOOP_SYSTEM = (
    "You are a coding agent working in a repository. Answer with exactly one tool call per turn, as JSON.\n"
    "Tools:\n"
    '- read_file {"path": string}: the file\'s text\n'
    '- write_file {"path": string, "content": string}: replace a file\n'
    '- run {"command": string}: run a shell command, returns its output\n'
    '- search {"pattern": string}: lines matching a regex, as path:line:text\n'
)


def loop_turn_messages(n: int) -> list[Any]:
    """Turn ``n``'s request: the system prompt, then per earlier turn the client's own record of the tool call
    and its result (a few hundred tokens each), then the new result. The same bytes for both engines."""
    from clover_local.engine.types import ChatMessage

    messages = [
        ChatMessage("system", LOOP_SYSTEM),
        ChatMessage("user", "Rename unpaid_orders to open_orders."),
    ]
    for turn in range(n):
        messages.append(ChatMessage("assistant", f'{{"tool": "read_file", "path": "orders_{turn}.py"}}'))
        body = ORDERS_HEAD.replace("unpaid_orders", f"unpaid_orders_{turn}")
        messages.append(ChatMessage("user", f"Result of read_file orders_{turn}.py:\n```python\n{body}```"))
    return messages


def agent_loop(model: str, turns: int, max_tokens: int, ctx: int, threads: int) -> list[dict[str, Any]]:
    """Each turn on the embedded engine and on llama-server (same threads, same context checkpoints as the plan
    gives a recurrent model), interleaved; per turn the prompt tokens, those evaluated, TTFT and decode speed."""
    from clover_local.engine.loader import load_engine
    from clover_local.engine.types import Finished, GenerationRequest
    from clover_local.llamacpp.server import find_llama_server, start_llama_server
    from clover_local.llamacpp.server_engine import LlamaServerEngine
    from clover_local.plan.memory import CTX_CHECKPOINTS
    from clover_local.plan.types import SpeculativePlan
    from clover_local.testing.settings import engine_settings

    off = SpeculativePlan(enabled=False)
    settings = engine_settings(
        model, ctx=ctx, threads=threads, speculative=off, ctx_checkpoints=CTX_CHECKPOINTS
    )
    embedded = load_engine(model, settings, speculative=off).engine
    binary = find_llama_server()
    assert binary is not None  # checked before the rounds
    argv = ["-m", model, "-c", str(ctx), "-np", "1", "-t", str(threads), "-tb", str(threads)]
    server = LlamaServerEngine(
        start_llama_server([*argv, "--ctx-checkpoints", str(CTX_CHECKPOINTS)], binary=binary),
        model_name=Path(model).stem,
    )
    rows: list[dict[str, Any]] = []
    try:
        for n in range(turns):
            request = GenerationRequest(
                messages=tuple(loop_turn_messages(n)), max_tokens=max_tokens, temperature=0.0
            )
            row: dict[str, Any] = {"turn": n + 1}
            for name, engine in (("embedded", embedded), ("llama-server", server)):
                stats = next(e.stats for e in engine.generate(request) if isinstance(e, Finished))
                row[name] = {
                    "prompt": stats.prompt_tokens,
                    "evaluated": stats.prompt_tokens - stats.cached_tokens,
                    "ttft_s": round(stats.ttft_s, 3),
                    "decode_tps": round(stats.decode_tokens_per_s, 1),
                }
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    finally:
        embedded.close()
        server.close()
    return rows


def print_loop(model: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{model}: tokens evaluated of the prompt per turn, TTFT, decode tokens/s")
    print(
        "| turn | prompt | embedded evaluated | llama-server evaluated | embedded TTFT | llama-server TTFT | "
        "embedded tok/s | llama-server tok/s |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        e, s = r["embedded"], r["llama-server"]
        print(
            f"| {r['turn']} | {e['prompt']} | {e['evaluated']} | {s['evaluated']} | {e['ttft_s']:.2f} s | "
            f"{s['ttft_s']:.2f} s | {e['decode_tps']} | {s['decode_tps']} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
