#!/usr/bin/env python3
"""Check the planner's RAM prediction against what llama.cpp really takes, on real GGUFs, CPU only.

For each model and context: the planner's prediction (``make_plan`` for Gemma with its preset on this
machine's RAM; ``plan.memory.place`` for the tiny models, which have no preset: the same arithmetic), then a
real load in a fresh process (``clover_local.testing.measure``): 512-token prefill + one decode. Columns:

- ``predicted``: weights + KV cache + recurrent state + compute/output buffers, as the planner sums them.
- ``reserved``: llama.cpp's own buffer sizes from its load log; ``pred/res`` checks the arithmetic.
- ``resident``: growth of the process's resident memory (anonymous + file-backed mapped weights);
  ``pred/rss`` is the headline: > 1 means the plan is conservative, < 1 that it under-counts.

Why they differ: llama.cpp reserves a compute buffer big enough for the logits of a whole ubatch
(n_ubatch x n_vocab x 4 bytes: 512 MiB for Gemma's 262K vocabulary), but Linux gives pages on first touch and
only the last token's logits are computed, so most of it never becomes resident. The planner counts the
reservation (an allocation that must succeed; on a GPU it is really taken), so on CPU RAM it over-predicts
by about that buffer. The tiny models are a few MB: fixed overheads dominate and their ratios mean little.

``--slots N`` checks what slots add instead (``clover_local.testing.measure_slots``): each model planned for 1 and
for N slots (the embedded engine's launch, as ``serve --parallel N``), each loaded with that plan's settings in a
fresh process, every slot's context filled, one token of each decoded in one batch. Per extra slot: ``planned``
(KV streams, recurrent state and its snapshots, a row of logits; the plan's checkpoints apart, since no load takes
them), ``reserved`` (llama.cpp's log) and ``resident`` (RSS growth), and ``plan/rss``. The compute buffer does not
grow with the slots, so what a CPU never touches of it cancels out: this is the honest check of the slot part.

Usage: ``.venv/bin/python benchmarks/check_memory_model.py [--quick] [--slots N [--model GGUF [--ctx C]]] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from clover_local.errors import CloverError
from clover_local.testing.measure import MIB, LoadSettings, Measurement, measure_load
from clover_local.testing.measure_slots import SlotsCheck, check_slots_memory


@dataclass(frozen=True)
class Row:
    label: str
    predicted: int
    predicted_compute: int
    measurement: Measurement

    @property
    def ratio_resident(self) -> float:
        return self.predicted / max(self.measurement.growth.rss, 1)

    @property
    def ratio_reserved(self) -> float:
        return self.predicted / max(self.measurement.reserved, 1)


def predict_gemma(path: Path, settings: LoadSettings) -> tuple[int, int]:
    """(RAM total, of which compute/output buffers) from the real planner for this machine and context."""
    from clover_local.detect.simulate import parse_simulate
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.planner import make_plan
    from clover_local.plan.types import Wishes
    from clover_local.presets import load_preset

    machine = parse_simulate("ram=24G,cpu=2")  # CPU only: every byte is planned in RAM
    plan = make_plan(
        machine,
        load_preset("gemma3-270m"),
        model=read_local_header(path),
        wishes=Wishes(ctx=settings.ctx),
        model_path=str(path),
    )
    if plan.n_ubatch != settings.n_ubatch or plan.cache_type_k != settings.type_k:
        raise CloverError(
            f"The plan changed its batch or KV settings ({plan.n_ubatch}, {plan.cache_type_k})."
        )
    return plan.memory.ram.used_bytes, plan.memory.ram.compute_bytes


def predict_tiny(path: Path, settings: LoadSettings) -> tuple[int, int]:
    """(RAM total, of which compute/output) from the memory model for a CPU-only placement."""
    from clover_local.gguf.header import read_local_header
    from clover_local.plan import memory

    p = memory.place(
        read_local_header(path),
        ctx=settings.ctx,
        n_gpus=0,
        n_gpu_layers=0,
        n_cpu_moe=0,
        type_k=settings.type_k,
        type_v=settings.type_v,
        n_ubatch=settings.n_ubatch,
    )
    return p.ram_weights + p.ram_kv + p.ram_recurrent + p.ram_compute, p.ram_compute


def run(quick: bool) -> list[Row]:
    from clover_local.testing.models import TINY_KINDS, gemma_path, tiny_model

    jobs: list[tuple[str, Path, LoadSettings, bool]] = []
    gemma_ctxs = (2048,) if quick else (2048, 16384)
    for ctx in gemma_ctxs:
        jobs.append(("gemma3-270m", gemma_path(), LoadSettings(ctx=ctx), True))
        if not quick:
            jobs.append(("gemma3-270m", gemma_path(), LoadSettings(ctx=ctx, use_mmap=False), True))
    for kind in TINY_KINDS:
        for ctx in (512,) if quick else (512, 4096):
            jobs.append((f"tiny {kind}", tiny_model(kind), LoadSettings(ctx=ctx, prompt_tokens=256), False))
    rows: list[Row] = []
    for label, path, settings, is_gemma in jobs:
        predicted, compute = (predict_gemma if is_gemma else predict_tiny)(path, settings)
        rows.append(Row(label, predicted, compute, measure_load(path, settings)))
        print(_format_row(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'model':<16} {'ctx':>6} {'mmap':>4} | {'predicted':>9} {'reserved':>9} {'pred/res':>8} | "
    f"{'resident':>9} {'(anon':>7} {'file)':>7} {'pred/rss':>8} | {'pred-compute':>12} {'ratio':>6}"
)


def _format_row(r: Row) -> str:
    m = r.measurement
    g = m.growth
    rest = r.predicted - r.predicted_compute
    return (
        f"{r.label:<16} {m.settings.ctx:>6} {'on' if m.settings.use_mmap else 'off':>4} | "
        f"{r.predicted / MIB:>8.1f}M {m.reserved / MIB:>8.1f}M {r.ratio_reserved:>8.2f} | "
        f"{g.rss / MIB:>8.1f}M {g.anon / MIB:>6.1f}M {g.file / MIB:>6.1f}M {r.ratio_resident:>8.2f} | "
        f"{rest / MIB:>11.1f}M {rest / max(g.rss, 1):>6.2f}"
    )


SLOT_CTX = {"gemma": 2048, "qwen35moe": 4096}
"""Context per slot for ``--slots``: Gemma 3 270M, and the tiny hybrid (whose KV and state are small, so the longest
context makes them stand out of the process's fixed overheads)."""


def run_slots(slots: int, quick: bool, model: Path | None = None, ctx: int | None = None) -> list[SlotsCheck]:
    """Gemma and the tiny hybrid at :data:`SLOT_CTX`, or only ``model`` (at ``ctx``, default 4096 per slot)."""
    from clover_local.testing.models import gemma_path, tiny_model

    print(SLOTS_HEADER)
    if model is not None:
        jobs = [(model, ctx or 4096)]
    else:
        paths = [gemma_path()] if quick else [gemma_path(), tiny_model("qwen35moe")]
        jobs = [(path, SLOT_CTX[name]) for name, path in zip(SLOT_CTX, paths, strict=False)]
    rows: list[SlotsCheck] = []
    for path, n_ctx in jobs:
        rows.append(check_slots_memory(path, n_ctx, slots))
        print(_format_slots(rows[-1]), flush=True)
    return rows


SLOTS_HEADER = (
    f"{'model':<32} {'ctx':>5} {'N':>2} | per extra slot: {'planned':>8} {'reserved':>8} {'resident':>8} "
    f"{'plan/rss':>8} | {'+checkpoints':>12}"
)


def _format_slots(c: SlotsCheck) -> str:
    return (
        f"{c.model[:32]:<32} {c.ctx:>5} {c.slots:>2} | {'':>15} {c.planned_per_slot / MIB:>7.2f}M "
        f"{c.reserved_per_slot / MIB:>7.2f}M {c.resident_per_slot / MIB:>7.2f}M {c.ratio:>8.3f} | "
        f"{c.checkpoints_per_slot / MIB:>11.2f}M"
    )


def _slots_dict(c: SlotsCheck) -> dict[str, object]:
    return {
        "model": c.model,
        "ctx_per_slot": c.ctx,
        "slots": c.slots,
        "planned_ram_bytes": {"1": c.planned_one, str(c.slots): c.planned_many},
        "planned_checkpoint_bytes": {"1": c.checkpoints_one, str(c.slots): c.checkpoints_many},
        "resident_growth_bytes": {"1": c.one.growth.rss, str(c.slots): c.many.growth.rss},
        "reserved_by_kind": {"1": c.one.buffers, str(c.slots): c.many.buffers},
        "filled_tokens_per_slot": c.many.filled_tokens,
        "planned_per_slot_bytes": round(c.planned_per_slot),
        "reserved_per_slot_bytes": round(c.reserved_per_slot),
        "resident_per_slot_bytes": round(c.resident_per_slot),
        "ratio_planned_to_resident_per_slot": round(c.ratio, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Planner RAM prediction vs llama.cpp reality (CPU).")
    parser.add_argument("--quick", action="store_true", help="one context per model, mmap only")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument(
        "--slots", type=int, metavar="N", help="check what N slots add against 1 (--quick: Gemma only)"
    )
    parser.add_argument("--model", type=Path, help="with --slots: check only this GGUF")
    parser.add_argument("--ctx", type=int, help="with --model: context per slot (default 4096)")
    args = parser.parse_args(argv)
    if args.model is not None and args.slots is None:
        parser.error("--model goes with --slots")
    if args.slots is not None:
        if args.slots < 2:
            parser.error("--slots needs 2 or more (it compares N slots with one)")
        try:
            checks = run_slots(args.slots, args.quick, args.model, args.ctx)
        except CloverError as e:
            print(e, file=sys.stderr)
            return 1
        if args.json:
            args.json.write_text(json.dumps([_slots_dict(c) for c in checks], indent=2))
        return 0
    print(HEADER)
    try:
        rows = run(args.quick)
    except CloverError as e:
        print(e, file=sys.stderr)
        return 1
    print(
        "\npredicted: planner's RAM total; reserved: llama.cpp's buffers (its log); resident: RSS growth after "
        "load + prefill + 1 decode (anonymous + mapped weight pages); pred-compute: prediction without the "
        "compute/output buffers, of which only a small part is ever touched on a CPU.\n"
        "Tiny models: a few MB, so fixed overheads (threads, allocator, graph) dominate; their ratios mean little."
    )
    if args.json:
        args.json.write_text(json.dumps([_row_dict(r) for r in rows], indent=2))
    return 0


def _row_dict(r: Row) -> dict[str, object]:
    m = r.measurement
    return {
        "model": r.label,
        "ctx": m.settings.ctx,
        "use_mmap": m.settings.use_mmap,
        "predicted_bytes": r.predicted,
        "predicted_compute_bytes": r.predicted_compute,
        "reserved_bytes": m.reserved,
        "reserved_by_kind": m.buffers,
        "resident_growth_bytes": m.growth.rss,
        "resident_anon_bytes": m.growth.anon,
        "resident_file_bytes": m.growth.file,
        "peak_rss_growth_bytes": m.peak_rss - m.before.rss,
        "ratio_predicted_to_resident": round(r.ratio_resident, 3),
        "ratio_predicted_to_reserved": round(r.ratio_reserved, 3),
    }


if __name__ == "__main__":
    sys.exit(main())
