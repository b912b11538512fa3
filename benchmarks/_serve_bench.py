"""What the serve benchmarks (``bench_serve.py``, ``bench_concurrency.py``, ``bench_agents.py``,
``bench_speculation.py`` beside it) send, and how they read a reply: one code file to rewrite, one request helper,
the figures llama.cpp-style ``timings`` give. Shared by benchmarks only, so it lives with them, not in
``clover_local.testing`` (what tests and benchmarks share)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from clover_local.llamacpp import http_client

BENCH_MODEL = "bench-model"
"""The model name the benchmarks' servers are given (llama-server serves one model and ignores it)."""

ORDERS_HEAD = """import json
from dataclasses import dataclass


@dataclass
class Order:
    order_id: int
    customer: str
    total_cents: int
    paid: bool = False


def load_orders(path):
    with open(path) as f:
        rows = json.load(f)
    return [Order(**row) for row in rows]


def unpaid_orders(orders):
    return [order for order in orders if not order.paid]


def total_unpaid(orders):
    return sum(order.total_cents for order in unpaid_orders(orders))
"""
"""A small Python module: the agent benchmark's file to edit."""
ORDERS_SOURCE = (
    ORDERS_HEAD
    + """

def orders_by_customer(orders):
    result = {}
    for order in orders:
        result.setdefault(order.customer, []).append(order)
    return result


def mark_paid(orders, order_id):
    for order in orders:
        if order.order_id == order_id:
            order.paid = True
            return order
    raise KeyError(order_id)
"""
)
"""The same module, longer: the serve benchmark's file to rewrite."""


def post(
    url: str, path: str, body: dict[str, Any], *, name: str, api_key: str | None = None
) -> tuple[dict[str, Any], float]:
    """POST ``body``; the reply's JSON and the wall-clock seconds it took. An error reply ends the benchmark."""
    started = time.perf_counter()
    resp = http_client.request(url, "POST", path, body, api_key=api_key, timeout_s=900)
    wall = time.perf_counter() - started
    data = resp.json()
    if resp.status != 200:
        raise SystemExit(f"{name}: HTTP {resp.status}: {data}")
    return data, wall


def text_hash(text: str) -> float:
    """A reply's text as a number (32 bits of its sha256), so benchmark rows can show whether texts agree."""
    return float(int(hashlib.sha256(text.encode()).hexdigest()[:8], 16))


def reply_figures(data: dict[str, Any], wall: float) -> dict[str, float]:
    """Seconds, tokens, decode tokens/s, draft acceptance (NaN when nothing was drafted) and the text's hash of
    one reply."""
    t = data.get("timings") or {}
    drafted = float(t.get("draft_n") or 0)
    tokens = float(data["usage"]["completion_tokens"])
    choice = (data.get("choices") or [{}])[0]
    text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
    return {
        "seconds": wall,
        "text_hash": text_hash(text),
        "tokens": tokens,
        "decode_tps": float(t.get("predicted_per_second") or 0.0),
        "end_to_end_tps": tokens / wall if wall else 0.0,
        "acceptance": float(t.get("draft_n_accepted") or 0) / drafted if drafted else float("nan"),
        "drafted": drafted,
    }
