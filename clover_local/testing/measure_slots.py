"""Measure what N slots add to a process's resident memory, to check the planner's per-slot bytes against.

A one-slot load is mostly weights and a compute buffer that a CPU run barely touches (``testing.measure``), so
it cannot say whether the plan counts slots right. The part that grows with the slots can: KV cache streams,
recurrent state (and its rollback snapshots), the rows of returned logits. So each load runs in a fresh process
(``python -m clover_local.testing.measure_slots``) with the settings the product renders for the plan
(``llama_settings(plan).kwargs()``, loaded through the engine's own ``build_params``), prefills every slot's
sequence to near its context, so each stream's cells are written, then decodes one token of every sequence in
one batch (each returns logits), takes each slot's copy of its recurrent state where the engine rolls n-gram
drafts back from one (planned for every slot), and reports its resident growth and llama.cpp's buffer sizes.
The difference between an N-slot and a one-slot measurement is what the N - 1 extra slots really take.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clover_local.testing.measure import MemoryUse, parse_buffer_log, read_memory_use, run_measuring_child

FILL_MARGIN = 16
"""Tokens left free at the end of each slot's context (the last decode needs one)."""
_PROMPT_TEXT = (
    "Each slot holds its own context: a stream of cache cells for every attention layer, written as the prompt "
    "is read, and a recurrent state on hybrid models. Agents fan out, so several requests decode at once. "
)


@dataclass(frozen=True)
class SlotsMeasurement:
    """One fresh-process load with ``n_seq`` slots, every slot filled."""

    model: str
    n_seq: int
    n_ctx_seq: int
    filled_tokens: int
    """Tokens prefilled into each slot's sequence."""
    before: MemoryUse
    after_load: MemoryUse
    after_fill: MemoryUse
    buffers: dict[str, int] = field(default_factory=dict)
    """Bytes llama.cpp reserved, by kind (``testing.measure.parse_buffer_log``)."""

    @property
    def growth(self) -> MemoryUse:
        """What loading and filling every slot added to the process's resident memory."""
        return self.after_fill.minus(self.before)


@dataclass(frozen=True)
class SlotsCheck:
    """The plan's memory for 1 and for N slots of one model, against fresh-process loads of both, every slot
    filled: what the N - 1 extra slots are planned to take, and what they add to resident memory."""

    model: str
    ctx: int
    """Tokens of context per slot."""
    slots: int
    planned_one: int
    planned_many: int
    """The plan's RAM total (``plan.memory.ram.used_bytes``) for 1 and for ``slots`` slots."""
    checkpoints_one: int
    checkpoints_many: int
    """Of which context checkpoints: the embedded engine's copies of a slot's state, taken between turns (never
    here), so counted on the plan's side only."""
    one: SlotsMeasurement
    many: SlotsMeasurement

    def _per_slot(self, one: int, many: int) -> float:
        return (many - one) / (self.slots - 1)

    @property
    def planned_per_slot(self) -> float:
        """Planned bytes of one more slot, without its checkpoints (which no load takes)."""
        return self._per_slot(
            self.planned_one - self.checkpoints_one, self.planned_many - self.checkpoints_many
        )

    @property
    def checkpoints_per_slot(self) -> float:
        return self._per_slot(self.checkpoints_one, self.checkpoints_many)

    @property
    def reserved_per_slot(self) -> float:
        """What llama.cpp's buffers (its log) grew by, per slot."""
        return self._per_slot(sum(self.one.buffers.values()), sum(self.many.buffers.values()))

    @property
    def resident_per_slot(self) -> float:
        """What the process's resident memory grew by, per slot."""
        return self._per_slot(self.one.growth.rss, self.many.growth.rss)

    @property
    def ratio(self) -> float:
        """Planned over resident, per slot: 1 is exact, > 1 conservative."""
        return self.planned_per_slot / max(self.resident_per_slot, 1.0)


MEASURING_MACHINE = "ram=24G,cpu=2"
"""The machine the slots are planned for: CPU only, so every planned byte is in RAM, with room for any slots."""


def check_slots_memory(model_path: Path, ctx: int, slots: int, fill: int | None = None) -> SlotsCheck:
    """Plan ``model_path`` with ``ctx`` tokens per slot for 1 and for ``slots`` slots on the embedded engine
    (``decide_launch``, as ``serve --parallel N`` does), load each with the settings that launch renders in a
    fresh process, fill every slot (:func:`measure_slots`) and put the two side by side."""
    from clover_local.detect.simulate import parse_simulate
    from clover_local.errors import CloverError
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.plan.memory import rolls_back_from_a_copy

    machine = parse_simulate(MEASURING_MACHINE)
    launches = [
        decide_launch(
            LaunchRequest(model=str(model_path), ctx=ctx, engine="embedded", parallel=n), machine=machine
        )
        for n in (1, slots)
    ]
    for launch, n in zip(launches, (1, slots), strict=True):
        if launch.plan.parallel != n or launch.plan.ctx != ctx:
            raise CloverError(
                f"The plan for {n} slots has {launch.plan.parallel} of {launch.plan.ctx} tokens."
            )
    one, many = (
        measure_slots(
            model_path,
            launch.settings.kwargs(),
            fill,
            copy_state=launch.plan.recurrent and rolls_back_from_a_copy(launch.plan.speculative),
        )
        for launch in launches
    )
    ram_one, ram_many = (launch.plan.memory.ram for launch in launches)
    return SlotsCheck(
        model=model_path.name,
        ctx=ctx,
        slots=slots,
        planned_one=ram_one.used_bytes,
        planned_many=ram_many.used_bytes,
        checkpoints_one=ram_one.checkpoint_bytes,
        checkpoints_many=ram_many.checkpoint_bytes,
        one=one,
        many=many,
    )


def measure_slots(
    model_path: Path,
    settings: dict[str, Any],
    fill: int | None = None,
    timeout_s: float = 900,
    *,
    copy_state: bool = False,
) -> SlotsMeasurement:
    """Load ``model_path`` with ``settings`` (the producer's kwargs) in a fresh process, fill each slot with
    ``fill`` tokens (None: its whole context less :data:`FILL_MARGIN`) and measure it. ``copy_state``: also take
    each slot's copy of its recurrent state as the embedded engine does before verifying an n-gram draft
    (``engine.checkpoints.DraftRollback``), which the plan counts for every slot that drafts."""
    request = {"model": str(model_path), "settings": settings, "fill": fill, "copy_state": copy_state}
    what = f"Measuring {model_path.name} with slots"
    result, _log = run_measuring_child("clover_local.testing.measure_slots", request, what, timeout_s)
    return SlotsMeasurement(
        model=model_path.name,
        n_seq=result["n_seq"],
        n_ctx_seq=result["n_ctx_seq"],
        filled_tokens=result["filled_tokens"],
        before=MemoryUse(**result["before"]),
        after_load=MemoryUse(**result["after_load"]),
        after_fill=MemoryUse(**result["after_fill"]),
        buffers=parse_buffer_log(result["log"]),
    )


def _set_token(batch: Any, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = logits


def _child(request: dict[str, Any]) -> dict[str, Any]:
    """Runs in the fresh process: load, fill every slot, decode one token of each in one batch, report."""
    from llama_cpp import llama_cpp as C

    from clover_local.engine.checkpoints import DraftRollback
    from clover_local.engine.native import LogCapture, build_params

    settings: dict[str, Any] = request["settings"]
    before = read_memory_use()
    params = build_params(settings)
    with LogCapture() as log:
        C.llama_backend_init()
        model = C.llama_model_load_from_file(str(request["model"]).encode(), params.model)
        ctx = C.llama_init_from_model(model, params.context) if model else None
    if not ctx:
        raise SystemExit(f"Loading failed:\n{log.text[-3000:]}")
    after_load = read_memory_use()
    n_seq, n_ctx_seq = int(settings["n_seq_max"]), int(C.llama_n_ctx_seq(ctx))
    fill = min(request["fill"] or n_ctx_seq, n_ctx_seq - FILL_MARGIN)
    tokens = _tokens(model, fill)
    n_batch = int(settings["n_batch"])
    batch = C.llama_batch_init(max(n_batch, n_seq), 0, 1)
    try:
        for seq in range(n_seq):
            for start in range(0, fill, n_batch):
                chunk = tokens[start : start + n_batch]
                for i, tok in enumerate(chunk):
                    _set_token(batch, i, tok, start + i, seq, i == len(chunk) - 1)
                batch.n_tokens = len(chunk)
                if C.llama_decode(ctx, batch) != 0:
                    raise SystemExit(f"Prefilling slot {seq} failed at {start}.")
        for seq in range(n_seq):  # every slot's next token in one batch, each returning its logits
            _set_token(batch, seq, tokens[0], fill, seq, True)
        batch.n_tokens = n_seq
        if C.llama_decode(ctx, batch) != 0:
            raise SystemExit("Decoding one token of every slot failed.")
        copies = [DraftRollback(ctx, seq) for seq in range(n_seq)] if request.get("copy_state") else []
        if not all(copy.save() for copy in copies):
            raise SystemExit("Copying a slot's recurrent state failed.")
        after_fill = read_memory_use()
    finally:
        C.llama_batch_free(batch)
    return {
        "n_seq": n_seq,
        "n_ctx_seq": n_ctx_seq,
        "filled_tokens": fill,
        "before": asdict(before),
        "after_load": asdict(after_load),
        "after_fill": asdict(after_fill),
        "log": log.text,
    }


def _tokens(model: Any, n: int) -> list[int]:
    """``n`` tokens of plain text (repeated as needed)."""
    from llama_cpp import llama_cpp as C

    vocab = C.llama_model_get_vocab(model)
    text = _PROMPT_TEXT.encode()
    buf = (C.llama_token * (len(text) + 8))()
    count = int(C.llama_tokenize(vocab, text, len(text), buf, len(buf), False, False))
    if count <= 0:
        raise SystemExit("Tokenizing the fill text failed.")
    one = [int(t) for t in buf[:count]]
    return (one * (1 + n // count))[:n]


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
