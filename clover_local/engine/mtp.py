"""Drafting with the model's own multi-token-prediction head, in-process: llama.cpp's
``common_speculative_impl_draft_mtp`` (``common/speculative.cpp`` at the pinned commit) for one sequence, over
llama-cpp-python's ctypes bindings.

The head (qwen35moe: one full-attention MoE block, ``blk.<n_layer>.nextn.*``) runs in a second llama.cpp
context of type ``LLAMA_CONTEXT_TYPE_MTP`` on the same weights (loaded with ``load_mtp``), or on an ``mtp-``
sidecar loaded as a second model. It reads, for each position ``p``, the token at ``p`` and the trunk's last
hidden state at ``p - 1`` (``h_nextn``), so:

- every batch the trunk evaluates is replayed through the head (:meth:`MtpHead.process`), each token paired
  with the trunk's hidden row one position earlier (the first with the row kept from the previous batch);
- a draft starts from the sampled token and the trunk's row that predicted it, and feeds the head's own
  output row back for each next token, greedily (:meth:`MtpHead.draft`), then forgets its own cache entries;
- after verification, the row of the last accepted position becomes the next starting row (:meth:`accept`).

The staging API that exposes the hidden rows (``llama_set_embeddings_nextn``, ``llama_get_embeddings_nextn``,
``llama_get_embeddings_nextn_ith``) is declared in ``src/llama-ext.h`` without ``extern "C"``: libllama
exports it under C++-mangled names, found here by those names.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as C

from clover_local.errors import EngineError

LLAMA_CONTEXT_TYPE_MTP = 1
LLAMA_PROCESS_TYPE_DECODE = 1
_MANGLED = {
    "set_embeddings_nextn": "_Z26llama_set_embeddings_nextnP13llama_contextbb",
    "get_embeddings_nextn": "_Z26llama_get_embeddings_nextnP13llama_context",
    "get_embeddings_nextn_ith": "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
}
"""``llama-ext.h`` functions as the Itanium C++ ABI names them (GCC and Clang, Linux and macOS)."""


def nextn_api() -> tuple[Any, Any, Any]:
    """The mangled staging functions (set, get, get_ith) from the libllama llama-cpp-python loaded, typed; an
    EngineError when this build lacks them."""
    try:
        set_fn, get_fn, ith_fn = (getattr(C._lib, name) for name in _MANGLED.values())
    except AttributeError as exc:
        raise EngineError(
            "This llama.cpp build does not export the MTP staging API (llama_set_embeddings_nextn).",
            "Use --spec ngram, or run the MTP head in llama-server (--engine llama-server).",
        ) from exc
    set_fn.argtypes, set_fn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    get_fn.argtypes, get_fn.restype = [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)
    ith_fn.argtypes, ith_fn.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)
    return set_fn, get_fn, ith_fn


class MtpHead:
    """The MTP draft context beside the engine's target context, for sequence 0."""

    def __init__(
        self, ctx_tgt: Any, model_dft: Any, context_params: Any, *, n_max: int = 3, owns_model: bool = False
    ) -> None:
        """``model_dft``: the target model itself (its head loaded with ``load_mtp``) or an ``mtp-`` sidecar;
        ``context_params``: the target's (n_ctx, batch sizes, threads, cache types), copied for the draft."""
        if int(C.llama_model_n_layer_nextn(model_dft)) <= 0:
            raise EngineError(
                "The model has no MTP head (nextn_predict_layers is 0), or it was not loaded (load_mtp).",
                "Use --spec ngram, or a GGUF that ships an MTP head (in the file or as an mtp- sidecar).",
            )
        set_embeddings_nextn, self._get_nextn, self._get_nextn_ith = nextn_api()
        cp = C.llama_context_params.from_buffer_copy(context_params)
        cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP
        cp.n_ctx = int(C.llama_n_ctx(ctx_tgt))  # as many tokens as the target (speculative.cpp)
        cp.n_rs_seq = 0
        cp.n_seq_max = 1
        cp.n_outputs_max = 1
        cp.n_outputs_max_per_seq = 1
        cp.type_k = C.GGML_TYPE_F16  # llama.cpp's draft default (--spec-draft-type-k)
        cp.type_v = C.GGML_TYPE_F16
        cp.embeddings = False
        ctx = C.llama_init_from_model(model_dft, cp)
        if not ctx:
            raise EngineError("llama.cpp could not create the MTP draft context (see its log).")
        self._ctx_tgt = ctx_tgt
        self._ctx = ctx
        self._model = model_dft
        self._owns_model = owns_model
        self._mem = C.llama_get_memory(ctx)
        self.n_embd = int(C.llama_model_n_embd_out(model_dft))
        self.n_vocab = int(C.llama_vocab_n_tokens(C.llama_model_get_vocab(model_dft)))
        self.n_max = n_max
        self._batch = C.llama_batch_ext_init(ctx)
        self._pos = (C.llama_pos * 4)()
        set_embeddings_nextn(ctx_tgt, True, False)  # every trunk row, for the replay
        set_embeddings_nextn(ctx, True, True)  # the head's rows for its outputs only
        self.pending_h = np.zeros(self.n_embd, dtype=np.float32)
        self._verify_h = np.zeros((0, self.n_embd), dtype=np.float32)
        self._closed = False

    # --- the three hooks of common_speculative_impl_draft_mtp ---------------------------------------------------

    def process(self, tokens: Sequence[int], start: int) -> None:
        """After the target evaluated ``tokens`` at ``start``...: the same tokens through the head, each paired
        with the target's hidden row one position earlier; remember the target's rows for :meth:`accept`."""
        n = len(tokens)
        if n == 0:
            return
        ptr = self._get_nextn(self._ctx_tgt)
        if not ptr:
            raise EngineError("The target context returned no hidden rows for the MTP head.")
        h_tgt = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()
        rows = np.vstack([self.pending_h[None, :], h_tgt[:-1]]) if n > 1 else self.pending_h[None, :]
        self._run([(int(t), start + k, False) for k, t in enumerate(tokens)], rows)
        self._verify_h = h_tgt
        self.pending_h = h_tgt[-1].copy()

    def draft(self, id_last: int, pos0: int, n_max: int) -> list[int]:
        """Up to ``min(self.n_max, n_max)`` tokens after ``id_last`` (at ``pos0``), greedily; the head's cache
        entries from ``pos0`` on are dropped again afterwards (llama-server does the same)."""
        out: list[int] = []
        if n_max <= 0:
            return out
        token, row = id_last, self.pending_h
        for i in range(self.n_max):
            self._run([(token, pos0 + i, True)], row[None, :])
            logits = C.llama_get_logits_ith(self._ctx, 0)
            token = int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.n_vocab,))))
            out.append(token)
            if len(out) >= self.n_max:
                break
            h_ptr = self._get_nextn_ith(self._ctx, 0)
            row = np.ctypeslib.as_array(h_ptr, shape=(self.n_embd,)).copy()
        self.truncate(pos0)
        return out[:n_max]

    def accept(self, n_accepted: int) -> None:
        """``n_accepted`` drafted tokens were kept: the next draft starts from the row after the last of them."""
        n_rows = len(self._verify_h)
        if n_rows:
            self.pending_h = self._verify_h[min(n_accepted, n_rows - 1)].copy()

    # --- cache bookkeeping ------------------------------------------------------------------------------------

    def truncate(self, n_keep: int) -> None:
        """Forget the head's cache from position ``n_keep`` on (it follows the target's)."""
        C.llama_memory_seq_rm(self._mem, 0, n_keep, -1)

    def clear(self) -> None:
        C.llama_memory_clear(self._mem, True)
        self.pending_h[:] = 0.0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        C.llama_batch_ext_free(self._batch)
        C.llama_free(self._ctx)
        if self._owns_model:
            C.llama_model_free(self._model)

    def _run(self, items: list[tuple[int, int, bool]], rows: np.ndarray) -> None:
        """One ``llama_process`` on the draft context: (token, position, output) with its hidden row."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        C.llama_batch_ext_clear(self._batch)
        for k, (token, pos, output) in enumerate(items):
            idx = C.llama_batch_ext_add_token(self._batch, 0, token)
            if idx < 0:
                raise EngineError(f"The MTP batch refused token {k} (error {idx}).")
            self._pos[0] = pos
            C.llama_batch_ext_set_pos(self._batch, idx, self._pos)
            embd = C.llama_embd(rows[k].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
            if not C.llama_batch_ext_set_embd_token(self._batch, idx, embd):
                raise EngineError("The MTP batch refused a hidden row.")
            C.llama_batch_ext_set_output_logits(self._batch, idx, output)
        self._keep = rows  # the batch points into it until the next call
        rc = C.llama_process(self._ctx, LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise EngineError(f"The MTP head failed to evaluate (llama_process returned {rc}).")


def open_mtp_head(
    model: Any, ctx: Any, model_params: Any, context_params: Any, sidecar: str | None, n_max: int
) -> MtpHead:
    """The head for a loaded target: on its own weights (loaded with ``load_mtp``), or on the ``mtp-`` sidecar
    loaded now with the target's placement."""
    if sidecar is None:
        return MtpHead(ctx, model, context_params, n_max=n_max)
    mp = C.llama_model_params.from_buffer_copy(model_params)
    mp.load_mtp = True
    mp.progress_callback = C.llama_progress_callback(0)
    side = C.llama_model_load_from_file(sidecar.encode(), mp)
    if not side:
        raise EngineError(
            f"llama.cpp could not load the MTP sidecar {sidecar}.", "Check the file, or use --spec ngram."
        )
    try:
        return MtpHead(ctx, side, context_params, n_max=n_max, owns_model=True)
    except BaseException:
        C.llama_model_free(side)
        raise
