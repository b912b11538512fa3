"""Block-diffusion generation over llama-cpp-python's ctypes API, step for step as llama.cpp's
``examples/diffusion/diffusion.cpp`` (``diffusion_generate``) does it.

The answer starts as mask tokens after the prompt; attention is bidirectional (``llama_set_causal_attn``
off). Each step decodes the whole canvas in one batch, samples every masked position of the current block
through the same llama.cpp sampler chain the cli builds (top-k, top-p, temperature, ``dist``), scores it
(confidence, entropy, margin, random) and unmasks the best ones; the timestep schedule (Dream) works on the
whole canvas, the block schedule (LLaDA) block after block. The same seed gives the same tokens as
``llama-diffusion-cli``: the sampler chain is llama.cpp's own, and the algorithms that draw from the C++
``std::mt19937`` (origin, random, Gumbel noise) draw from an identical generator.

One deliberate difference: blocks that hold no mask (the cli's block count covers the prompt too) are not
decoded; the cli decodes them once and finds nothing to do, so the tokens are the same, only sooner.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as C

from clover_local.engine.diffusion_schedule import (
    Algorithm,
    DiffusionParams,
    Mt19937,
    block_bounds,
    transfer_count,
    transfer_counts_for_block,
)
from clover_local.engine.sampling import TOKEN_DATA, LogitsView, token_data_array
from clover_local.errors import EngineError

_TOKEN_DATA_ARRAY = np.dtype(
    [("data", "<u8"), ("size", "<u8"), ("selected", "<i8"), ("sorted", "?"), ("pad", "V7")]
)
"""``llama_token_data_array`` (include/llama.h: pointer, size_t, int64_t, bool; 32 bytes on 64-bit), held in
numpy so that many are filled at once; handed to ``llama_sampler_apply`` through pointers of the binding's
type."""

_APPLY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
    ctypes.cast(C.llama_sampler_apply, ctypes.c_void_p).value or 0
)
"""``llama_sampler_apply`` called with plain addresses: half the call cost of the binding's typed pointers, which
counts at one call per masked row per step."""

_CUT_FROM_LOGITS = 32_768
"""Below this many logits in a step (rows x vocabulary) the chain sorts whole rows faster than numpy cuts them
(the cut's dozen array operations cost more than they save: measured on the 825-token test vocabulary, 1% a
step either way of it)."""


@dataclass(frozen=True)
class StepView:
    """The canvas after one step, for live views: the answer's tokens (masks included) and where we are."""

    step: int
    total_steps: int
    answer: np.ndarray
    """Token ids of the answer part of the canvas (a copy); ``mask_token_id`` where still masked."""


@dataclass(frozen=True)
class DiffusionResult:
    tokens: list[int]
    """The answer (the canvas after the prompt), masks left where generation was cancelled."""
    steps_run: int
    """Decoded steps (empty blocks cost none)."""
    unmasked: int
    """Answer positions that hold a real token at the end."""
    seconds: float
    decode_seconds: float
    cancelled: bool

    @property
    def tokens_per_step(self) -> float:
        return self.unmasked / self.steps_run if self.steps_run else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.unmasked / self.seconds if self.seconds > 0 else 0.0


class DiffusionRunner:
    """Runs diffusion generations on a loaded llama.cpp model and context (one at a time).

    The context must have ``n_ubatch >= max_length``: the whole canvas is one micro-batch."""

    def __init__(self, model: Any, ctx: Any, shift_logits: bool) -> None:
        if not C.llama_model_is_diffusion(model):
            raise EngineError("This model is not a diffusion model.", "Use the autoregressive engine for it.")
        self._ctx = ctx
        vocab = C.llama_model_get_vocab(model)
        self.mask_token_id = int(C.llama_vocab_mask(vocab))
        if self.mask_token_id < 0:
            raise EngineError(
                "This diffusion model's vocabulary has no mask token (tokenizer.ggml.mask_token_id).",
                "The GGUF is incomplete: convert it again with a current convert_hf_to_gguf.py.",
            )
        self.n_vocab = int(C.llama_vocab_n_tokens(vocab))
        self.n_ubatch = int(C.llama_n_ubatch(ctx))
        self.n_ctx = int(C.llama_n_ctx(ctx))
        self.shift_logits = shift_logits
        self._fresh = np.zeros(self.n_vocab, dtype=TOKEN_DATA)
        self._fresh["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._cand_buf: Any = None
        self._cand_view = np.empty(0, dtype=TOKEN_DATA)
        self._cand_capacity = 0
        self._cand_base = 0
        self._row_arrays = np.zeros(0, dtype=_TOKEN_DATA_ARRAY)
        self._row_ptrs: list[int] = []
        self._batch: Any = None
        self._batch_size = 0
        self._logits = LogitsView(ctx, self.n_vocab)

    def close(self) -> None:
        if self._batch is not None:
            C.llama_batch_free(self._batch)
            self._batch = None

    def params(self, **kwargs: Any) -> DiffusionParams:
        """:class:`DiffusionParams` with this model's mask token and ``shift_logits`` filled in."""
        kwargs.setdefault("mask_token_id", self.mask_token_id)
        kwargs.setdefault("shift_logits", self.shift_logits)
        return DiffusionParams(**kwargs)

    def generate(self, prompt: list[int], params: DiffusionParams) -> DiffusionResult:
        """Fill ``params.max_length - len(prompt)`` answer positions."""
        steps = self.steps(prompt, params)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            result: DiffusionResult = done.value
            return result

    def steps(
        self, prompt: list[int], params: DiffusionParams, cancel: threading.Event | None = None
    ) -> Generator[StepView, None, DiffusionResult]:
        """:meth:`generate` as a generator: a :class:`StepView` after each step, the result at the end."""
        n_input = len(prompt)
        try:
            params.check(n_input)
        except ValueError as e:
            raise EngineError(f"Diffusion settings do not fit: {e}.") from None
        if params.max_length > self.n_ubatch or params.max_length > self.n_ctx:
            raise EngineError(
                f"The canvas ({params.max_length} tokens) is larger than the context's batch "
                f"(n_ubatch {self.n_ubatch}, n_ctx {self.n_ctx}).",
                "Load the model with n_ubatch = n_batch = n_ctx >= prompt + answer length.",
            )
        tokens = self._prepare_batch(prompt, params)
        C.llama_set_causal_attn(self._ctx, False)
        rng = Mt19937(params.seed)
        sampler = _sampler_chain(params)
        dist = C.llama_sampler_init_dist(params.seed & 0xFFFFFFFF)
        steps_run = 0
        cancelled = False
        t0 = time.perf_counter()
        decode_s = 0.0
        try:
            for block in range(params.n_blocks):
                start, end = block_bounds(params, n_input, block)
                block_counts: list[int] = []
                if params.block_length:
                    masked = int(np.count_nonzero(tokens[start:end] == params.mask_token_id))
                    if masked == 0:
                        continue  # the cli decodes once here and finds nothing to unmask
                    block_counts = transfer_counts_for_block(masked, params.steps_per_block)
                for step in range(params.steps_per_block):
                    if cancel is not None and cancel.is_set():
                        cancelled = True
                        break
                    mask_positions = start + np.flatnonzero(tokens[start:end] == params.mask_token_id)
                    if len(mask_positions) == 0:
                        break
                    td = time.perf_counter()
                    logits = self._decode(params.max_length)
                    decode_s += time.perf_counter() - td
                    steps_run += 1
                    self._unmask_step(
                        tokens, logits, mask_positions, step, params, block_counts, sampler, dist, rng
                    )
                    yield StepView(
                        block * params.steps_per_block + step, params.steps, tokens[n_input:].copy()
                    )
                if cancelled:
                    break
        finally:
            C.llama_sampler_free(sampler)
            C.llama_sampler_free(dist)
            C.llama_set_causal_attn(self._ctx, True)
        seconds = time.perf_counter() - t0
        answer = tokens[n_input:]
        return DiffusionResult(
            tokens=[int(t) for t in answer],
            steps_run=steps_run,
            unmasked=int(np.count_nonzero(answer != params.mask_token_id)),
            seconds=seconds,
            decode_seconds=decode_s,
            cancelled=cancelled,
        )

    # --- one step ------------------------------------------------------------------------------------------------

    def _prepare_batch(self, prompt: list[int], params: DiffusionParams) -> np.ndarray:
        n = params.max_length
        if self._batch is None or self._batch_size < n:
            self.close()
            self._batch = C.llama_batch_init(n, 0, 1)
            self._batch_size = n
            np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n,))[:] = 1
            for i in range(n):
                self._batch.seq_id[i][0] = 0
        self._b_token = np.ctypeslib.as_array(self._batch.token, shape=(self._batch_size,))
        np.ctypeslib.as_array(self._batch.pos, shape=(self._batch_size,))[:n] = np.arange(n, dtype=np.int32)
        np.ctypeslib.as_array(self._batch.logits, shape=(self._batch_size,))[:n] = 1
        self._batch.n_tokens = n
        # The canvas is the batch's own token array: unmasking writes straight into what the next step decodes.
        tokens: np.ndarray = self._b_token[:n]
        tokens[:] = params.mask_token_id
        tokens[: len(prompt)] = prompt
        return tokens

    def _decode(self, n: int) -> np.ndarray:
        """Decode the canvas (the batch holds its tokens) and view the logits of every position."""
        rc = C.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise EngineError(f"llama_decode failed on the diffusion canvas (code {rc}).")
        return self._logits.rows(n)

    def _sample_rows(
        self, logits: np.ndarray, rows: np.ndarray, params: DiffusionParams, sampler: Any
    ) -> _Sampled:
        """Run the sampler chain over each of ``rows`` (logit rows), in order, as the C++ does position by
        position. With top-k on, each row is first cut, in numpy and for all rows at once, to the candidates
        that can be in its top k (:func:`_top_k_superset`), in id order: the chain's ``top_k`` then sorts a few
        dozen entries instead of the vocabulary and keeps the same k. The one difference from handing it the
        whole vocabulary: candidates with exactly equal logits may come in another order."""
        n_rows = len(rows)
        sub = logits[rows]
        k = params.top_k
        cut = _top_k_superset(sub, k) if 0 < k < self.n_vocab and sub.size > _CUT_FROM_LOGITS else None
        if cut is not None:
            cols, vals, sizes = cut
            cand = self._candidates(len(cols))
            cand["id"] = cols
            cand["logit"] = vals  # p is left as it is: the chain writes it before anything reads it
            starts = np.cumsum(sizes) - sizes
        else:
            width = self.n_vocab
            cand = self._candidates(n_rows * width)
            # ids in order and p = 0, copied as raw words (a structured copy is ten times slower)
            cand.view(np.int32).reshape(n_rows, -1)[:] = self._fresh.view(np.int32)
            cand["logit"].reshape(n_rows, width)[:] = sub
            sizes = np.full(n_rows, width, dtype=np.int64)
            starts = np.arange(n_rows, dtype=np.int64) * width
        # One llama_token_data_array per row, filled at once; the loop only calls the sampler.
        arrays = self._row_arrays_for(n_rows)
        words = arrays.view(np.int64).reshape(n_rows, 4)  # data, size, selected, sorted (+ padding)
        words[:, 0] = starts * TOKEN_DATA.itemsize + self._cand_base
        words[:, 1] = sizes
        words[:, 2:] = (-1, 0)
        apply, chain = _APPLY, ctypes.cast(sampler, ctypes.c_void_p).value
        for ptr in self._row_ptrs[:n_rows]:
            apply(chain, ptr)
        return _Sampled(cand, starts, arrays["selected"].copy(), arrays["size"].astype(np.int64))

    def _candidates(self, n: int) -> np.ndarray:
        """A ctypes-backed flat array of ``n`` ``llama_token_data``, reused between steps."""
        if self._cand_capacity < n:
            self._cand_buf = (C.llama_token_data * n)()
            self._cand_capacity = n
            self._cand_base = ctypes.addressof(self._cand_buf)
            self._cand_view = np.ctypeslib.as_array(self._cand_buf).view(TOKEN_DATA).reshape(-1)
        return self._cand_view[:n]

    def _row_arrays_for(self, n: int) -> np.ndarray:
        """``n`` ``llama_token_data_array`` structs (and the address of each), reused between steps."""
        if len(self._row_ptrs) < n:
            assert ctypes.sizeof(C.llama_token_data_array) == _TOKEN_DATA_ARRAY.itemsize
            self._row_arrays = np.zeros(n, dtype=_TOKEN_DATA_ARRAY)
            base = self._row_arrays.ctypes.data
            self._row_ptrs = [base + i * _TOKEN_DATA_ARRAY.itemsize for i in range(n)]
        return self._row_arrays[:n]

    def _unmask_step(
        self,
        tokens: np.ndarray,
        logits: np.ndarray,
        mask_positions: np.ndarray,
        step: int,
        params: DiffusionParams,
        block_counts: list[int],
        sampler: Any,
        dist: Any,
        rng: Mt19937,
    ) -> None:
        if params.add_gumbel_noise and params.temperature > 0.0:
            _add_gumbel_noise(logits[0], params.temperature, rng)  # the C++ noises the first row only
        rows = np.maximum(mask_positions - 1, 0) if params.shift_logits else mask_positions
        n_masked = len(mask_positions)
        count = transfer_count(step, params.steps_per_block, n_masked, params, block_counts)
        if params.algorithm == Algorithm.ORIGIN:
            # The C++ draws from its generator position by position and samples the chosen ones in that order;
            # the generator and the sampler's own RNG are independent, so drawing first gives the same.
            p_transfer = np.float32(count) / np.float32(n_masked)
            chosen = np.asarray([rng.uniform_float() < p_transfer for _ in range(n_masked)], dtype=bool)
            if chosen.any():
                got = self._sample_rows(logits, rows[chosen], params, sampler)
                tokens[mask_positions[chosen]] = got.ids()
            return

        got = self._sample_rows(logits, rows, params, sampler)
        sampled = got.ids()
        if params.algorithm == Algorithm.CONFIDENCE:
            conf = got.selected_p()
        elif params.algorithm == Algorithm.ENTROPY:
            conf = got.neg_entropy()
        elif params.algorithm == Algorithm.MARGIN:
            conf = got.margin()
        else:  # RANDOM: one draw per position, in order
            conf = np.asarray([rng.uniform_float() for _ in range(n_masked)], dtype=np.float32)
        if count > 0:
            take = min(count, n_masked)
            if params.alg_temp == 0.0:
                # Highest confidence first, ties by position: the C++ partial_sort's strict order.
                order = np.argsort(-conf, kind="stable")[:take]
            else:
                order = _sample_positions(conf, params.alg_temp, take, dist)
            tokens[mask_positions[order]] = sampled[order]


@dataclass
class _Sampled:
    """The candidate rows after the sampler chain ran over each: what the C++ reads from ``cur_p``. Rows lie
    one after another in ``cand``: row i starts at ``starts[i]`` and keeps its first ``sizes[i]`` entries."""

    cand: np.ndarray
    starts: np.ndarray
    selected: np.ndarray
    sizes: np.ndarray

    @cached_property
    def _picked(self) -> np.ndarray:
        picked: np.ndarray = self.cand[self.starts + self.selected]
        return picked

    def ids(self) -> np.ndarray:
        return np.asarray(self._picked["id"], dtype=np.int32)

    def selected_p(self) -> np.ndarray:
        return np.asarray(self._picked["p"], dtype=np.float32)

    def margin(self) -> np.ndarray:
        p: np.ndarray = self.cand["p"]
        second = self.starts + np.minimum(1, self.sizes - 1)
        return np.asarray(
            np.where(self.sizes > 1, p[self.starts] - p[second], p[self.starts]), dtype=np.float32
        )

    def neg_entropy(self) -> np.ndarray:
        """``-sum p*logf(p + 1e-10)`` over each row's kept candidates, in float32, summed in order."""
        width = int(self.sizes.max())
        col = np.arange(width)[None, :]
        kept = col < self.sizes[:, None]
        p = self.cand["p"][np.where(kept, self.starts[:, None] + col, 0)].astype(np.float32)
        # The C++ calls logf; log in double rounded to float is the correctly rounded value, which glibc's logf
        # misses on 0.27% of floats in [0.01, 1] (docs/diffusion.md): a near-tie may order differently.
        logs = np.log((p + np.float32(1e-10)).astype(np.float64)).astype(np.float32)
        terms = np.where(kept, p * logs, np.float32(0.0)).astype(np.float32)
        return -np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]


def _top_k_superset(sub: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """For each row of ``sub`` (rows x vocabulary logits), the entries that can be among its k highest: those
    at or above a bound no higher than the k-th highest. The bound: split the row into ``n_sets >= k``
    disjoint sets (every ``n_sets``-th entry), take each set's maximum; the k-th highest of those maxima is
    reached by k entries of the row, so the row's k-th highest is at least that. A few dozen entries pass
    for k = 40, whatever the vocabulary. Returns (column ids, logits, per-row counts), rows one after another
    and ids in order within a row; None for a NaN logit (only the whole row then gives the chain's answer)."""
    n_rows, n_vocab = sub.shape
    if n_rows == 0 or math.isnan(sub.sum()):  # NaN anywhere (or +inf beside -inf): the whole rows then
        return None
    stride = max(1, n_vocab // (2 * k))
    n_sets = n_vocab // stride
    set_max = sub[:, : n_sets * stride].reshape(n_rows, stride, n_sets).max(axis=1)
    bound = np.partition(set_max, n_sets - k, axis=1)[:, n_sets - k]
    keep = sub >= bound[:, None]
    flat = np.flatnonzero(keep)
    return flat % n_vocab, sub.reshape(-1)[flat], np.count_nonzero(keep, axis=1)


def _sample_positions(conf: np.ndarray, alg_temp: float, take: int, dist: Any) -> np.ndarray:
    """The C++ ``alg_temp > 0`` branch: draw ``take`` distinct positions by softmax(confidence / alg_temp)
    with ``dist``."""
    view = np.zeros(len(conf), dtype=TOKEN_DATA)
    view["id"] = np.arange(len(conf), dtype=np.int32)
    view["logit"] = conf / np.float32(alg_temp)
    cur = token_data_array(view)
    picked: list[int] = []
    for _ in range(take):
        C.llama_sampler_apply(dist, ctypes.byref(cur))
        picked.append(int(cur.selected))
        # The C++ zeroes the pick's p, which its dist sampler recomputes from the logit, so a position can be
        # drawn twice and a mask survive the last step; taking the pick out of the draw avoids that (the cli
        # never sets alg_temp, so no cli output depends on it).
        view["logit"][cur.selected] = -np.inf
        cur.selected = -1
    return np.asarray(picked, dtype=np.int64)


def _add_gumbel_noise(row: np.ndarray, temperature: float, rng: Mt19937) -> None:
    """``exp(logit) / (-log u)^temperature`` for each entry, ``u`` uniform doubles from the C++ generator."""
    noise = np.maximum(rng.uniform_doubles(len(row)), 1e-20)
    gumbel = np.power(-np.log(noise), temperature)
    # expf in double then rounded to float: what a correctly rounded expf gives.
    exp_row = np.exp(row.astype(np.float64)).astype(np.float32).astype(np.float64)
    row[:] = (exp_row / gumbel).astype(np.float32)


def _sampler_chain(params: DiffusionParams) -> Any:
    chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    if params.top_k > 0:
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(params.top_p, 1))
    if params.temperature > 0.0:
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(params.temperature))
    C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))
    return chain
