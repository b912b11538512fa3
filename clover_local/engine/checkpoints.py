"""Context checkpoints: copies of a recurrent or hybrid model's sequence state at chosen prompt positions, so a
conversation that grows (an agent resending its whole history) re-evaluates only what is new.

A KV cache can be cut back to any position; a recurrent state (Mamba, Gated DeltaNet) holds only the state after
its last token, so a prompt that shares all but the last few tokens with the cache would be evaluated again from
the start. llama-server keeps *context checkpoints* (``--ctx-checkpoints``, ``tools/server/server-context.cpp``):
before the last few tokens of a prompt are evaluated it copies the parts of the sequence's memory that cannot be
rolled back (``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the recurrent state,
not the attention KV), and on the next prompt it restores the latest checkpoint inside the shared prefix and cuts
the attention KV back to it. The embedded engine does the same (``engine.embedded``); the plan bounds the count
and holds their RAM (``plan.memory.context_checkpoints``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from llama_cpp import llama_cpp as C

PARTIAL = C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
TAIL_TOKENS = 4
"""A checkpoint is taken this many tokens before the end of each prompt (llama-server's offset): the next prompt
renders the same history but may end its previous turn differently (a generation prompt, a dropped reasoning
block), so the checkpoint must lie a little inside the prompt to be shared."""


@dataclass(frozen=True)
class Checkpoint:
    n_tokens: int
    """The state after this many tokens of the cache."""
    data: Any
    """The state bytes (a ctypes buffer)."""


class Checkpoints:
    """At most ``limit`` checkpoints of sequence ``seq`` (one slot's), oldest dropped first."""

    def __init__(self, ctx: Any, limit: int, seq: int = 0) -> None:
        self._ctx = ctx
        self.limit = limit
        self.seq = seq
        self._kept: list[Checkpoint] = []
        self.restored = 0
        """How many times a checkpoint was restored (for tests and benchmarks)."""

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(c.n_tokens for c in self._kept)

    @property
    def held_bytes(self) -> int:
        return sum(len(c.data) for c in self._kept)

    def save(self, n_tokens: int) -> None:
        """Copy the state after ``n_tokens`` cached tokens (what the cache holds right now)."""
        if self.limit <= 0 or n_tokens <= 0:
            return
        size = int(C.llama_state_seq_get_size_ext(self._ctx, self.seq, PARTIAL))
        data = (ctypes.c_uint8 * size)()
        written = int(C.llama_state_seq_get_data_ext(self._ctx, data, size, self.seq, PARTIAL))
        if written != size:
            return
        self._kept = [c for c in self._kept if c.n_tokens != n_tokens]
        self._kept.append(Checkpoint(n_tokens, data))
        del self._kept[: max(0, len(self._kept) - self.limit)]

    def restore(self, n_max: int) -> int:
        """Put back the latest checkpoint at or before ``n_max`` tokens; returns its position (0: none)."""
        inside = [c for c in self._kept if 0 < c.n_tokens <= n_max]
        if not inside:
            return 0
        best = max(inside, key=lambda c: c.n_tokens)
        size = len(best.data)
        if int(C.llama_state_seq_set_data_ext(self._ctx, best.data, size, self.seq, PARTIAL)) != size:
            return 0
        self.restored += 1
        return best.n_tokens

    def forget_after(self, n_tokens: int) -> None:
        """Drop the checkpoints past ``n_tokens``: the cache no longer holds the tokens they came after."""
        self._kept = [c for c in self._kept if c.n_tokens <= n_tokens]

    def clear(self) -> None:
        self._kept.clear()


class DraftRollback:
    """The recurrent state of sequence ``seq`` kept while a draft is verified, on a model whose llama.cpp context
    holds no rollback snapshots (``n_rs_seq`` 0): llama-server's way for n-gram drafts on recurrent models
    (``tools/server/server-context.cpp``: a speculative checkpoint before the batch, restored and the accepted
    tokens evaluated again when part of the draft is rejected).

    Snapshots (``n_rs_seq``) need no second evaluation, but llama.cpp then writes ``n_rs_seq + 1`` copies of each
    layer's convolution state in every step's graph, drafted or not: on a 2-core CPU a hybrid model's plain
    steps ran 8-12% slower with the 17 snapshots that 16-token drafts need (8 of 8 interleaved pairs), and
    each snapshot holds a whole recurrent state (Clover's 63 MiB, 17 times). This copy costs a partial-state
    read per verified draft, one buffer reused."""

    def __init__(self, ctx: Any, seq: int) -> None:
        self._ctx = ctx
        self.seq = seq
        self._data: Any = None
        self._size = 0
        self.restored = 0
        """How many drafts were rolled back this way (for tests and benchmarks)."""

    def save(self) -> bool:
        """Copy the state as it is now; False when llama.cpp could not (the draft is then not verified)."""
        size = int(C.llama_state_seq_get_size_ext(self._ctx, self.seq, PARTIAL))
        if self._data is None or len(self._data) < size:
            self._data = (ctypes.c_uint8 * size)()
        self._size = int(C.llama_state_seq_get_data_ext(self._ctx, self._data, size, self.seq, PARTIAL))
        return self._size == size and size > 0

    def restore(self) -> bool:
        """Put back the state of the last :meth:`save`."""
        read = int(C.llama_state_seq_set_data_ext(self._ctx, self._data, self._size, self.seq, PARTIAL))
        if read != self._size:
            return False
        self.restored += 1
        return True
