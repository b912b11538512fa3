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

    .venv/bin/python scripts/bench_agents.py [--preset gemma3-270m] [--rounds 3] [--json]
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

from clover_local.testing.serve_bench import BENCH_MODEL, ORDERS_HEAD, post, reply_figures

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
    args = parser.parse_args()

    from clover_local.launch import LaunchRequest, decide_launch, open_launch
    from clover_local.llamacpp.binary import find_llama_server
    from clover_local.presets import load_preset
    from clover_local.runtime import require_model
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


if __name__ == "__main__":
    raise SystemExit(main())
