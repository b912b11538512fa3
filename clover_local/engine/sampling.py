"""Choosing the next token from logits: greedy with numpy straight on llama.cpp's logits buffer (no copy), or
llama.cpp's own sampler chain (top-k, top-p, min-p, temperature, seeded RNG) for everything else.

Both pick by *batch index*, so a speculative verification batch samples each drafted position in order; every
emitted token consumes exactly one sample, so a seeded run gives the same tokens with and without speculation
(up to llama.cpp's batched-vs-single numerical differences).

A request with a grammar (structured output, forced tool calls) adds a :class:`GrammarGate`: the unconstrained
pick is checked against the grammar alone (one token, cheap) and only when it breaks the grammar is the whole
vocabulary masked and the pick made again (llama.cpp's ``common_sampler_sample`` does the same). Every picked
token is then accepted into the grammar, in order, so a drafted token survives verification only when it is
exactly what the constrained sampler picks at its position.
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from llama_cpp import llama_cpp as C

from clover_local.errors import EngineError, RequestRefused


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    seed: int

    @property
    def greedy_fast(self) -> bool:
        """Plain argmax is enough (and much cheaper than a sampler chain over the whole vocabulary)."""
        return self.temperature <= 0.0 and self.repeat_penalty == 1.0


class LogitsView:
    """Numpy views of the context's logits buffer, cached while llama.cpp keeps the same buffer (building one
    costs ~0.1 ms: numpy makes a ctypes array type)."""

    def __init__(self, ctx: Any, n_vocab: int) -> None:
        self._ctx = ctx
        self._n_vocab = n_vocab
        self._key: tuple[int, int] = (0, 0)
        self._array: np.ndarray | None = None

    def rows(self, n_rows: int) -> np.ndarray:
        ptr = C.llama_get_logits(self._ctx)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value
        if not addr:
            raise EngineError("llama.cpp returned no logits.")
        if (addr, n_rows) != self._key or self._array is None:
            buf = (ctypes.c_float * (n_rows * self._n_vocab)).from_address(addr)
            # A ctypes array exposes the buffer protocol: no copy.
            self._array = np.frombuffer(cast(bytes, buf), dtype=np.float32).reshape(n_rows, self._n_vocab)
            self._key = (addr, n_rows)
        return self._array


TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
assert TOKEN_DATA.itemsize == ctypes.sizeof(C.llama_token_data)


def token_data_array(data: np.ndarray) -> Any:
    """A ``llama_token_data_array`` over ``data`` (:data:`TOKEN_DATA` entries, kept alive by the caller), unsorted
    and with nothing selected."""
    return C.llama_token_data_array(ctypes.cast(data.ctypes.data, C.llama_token_data_p), len(data), -1, False)


_TOP_CHECKED = 48
"""Greedy picks under a grammar try this many best tokens one by one before masking the whole vocabulary."""


class GrammarGate:
    """llama.cpp's grammar sampler for one generation: checks a token, masks a row, follows accepted tokens."""

    def __init__(self, vocab: Any, n_vocab: int, gbnf: str, ends: Sequence[int] = ()) -> None:
        """``ends``: tokens the engine ends a reply at that the vocabulary does not mark end-of-generation (a
        template's one-token turn marker, ``<|im_end|>``). llama.cpp's grammar reads such a token as its text,
        which a JSON string admits: unchecked, a reply could end inside a forced call (the soak's one embedded
        miss). Each is allowed only where the grammar allows the end, as the vocabulary's own end token is."""
        self._smpl = C.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        if not self._smpl:
            raise RequestRefused(  # the request's schema, not the engine, is at fault: a 400
                "llama.cpp could not parse the grammar built for this request.",
                "Simplify the JSON schema (see llama.cpp's grammars/README.md for what it supports).",
            )
        self._one = (C.llama_token_data * 1)()
        self._one_arr = C.llama_token_data_array(ctypes.cast(self._one, C.llama_token_data_p), 1, -1, False)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._all = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._all_arr = token_data_array(self._all)
        self._ends = frozenset(ends)
        eos = int(C.llama_vocab_eos(vocab))
        self._end = eos if eos >= 0 else int(C.llama_vocab_eot(vocab))
        """The vocabulary's own end token: what an ``ends`` token means to the grammar."""

    def allows(self, token: int) -> bool:
        if token in self._ends:
            return self._end >= 0 and self._allows(self._end)
        return self._allows(token)

    def _allows(self, token: int) -> bool:
        cell: Any = self._one[0]
        cell.id, cell.logit, cell.p = token, 0.0, 0.0
        self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
        C.llama_sampler_apply(self._smpl, ctypes.byref(self._one_arr))
        return bool(np.isfinite(self._one[0].logit))

    def full(self, logits: np.ndarray) -> Any:
        """A token-data array of every token with its logit (one buffer, refilled at each call)."""
        self._all["id"] = self._ids
        self._all["logit"] = logits
        self._all_arr.size, self._all_arr.selected, self._all_arr.sorted = len(self._ids), -1, False
        return self._all_arr

    def masked(self, logits: np.ndarray) -> Any:
        """A token-data array of ``logits`` with every token the grammar forbids at -inf."""
        C.llama_sampler_apply(self._smpl, ctypes.byref(self.full(logits)))
        if self._ends and not (self._end >= 0 and self._allows(self._end)):
            self._all["logit"][list(self._ends)] = -np.inf  # ids are positions: apply never reorders
        return self._all_arr

    def best_allowed(self, logits: np.ndarray) -> int:
        """The highest-logit token the grammar allows: the best few checked one by one (cheap), the whole
        vocabulary masked only when none of them fits."""
        k = min(_TOP_CHECKED, len(logits))
        top = np.argpartition(logits, -k)[-k:]
        for token in top[np.argsort(-logits[top], kind="stable")]:
            if self.allows(int(token)):
                return int(token)
        self.masked(logits)
        best = int(self._all["logit"].argmax())
        if not np.isfinite(self._all["logit"][best]):
            raise EngineError(
                "The grammar allows no token here (it cannot be completed with this vocabulary)."
            )
        return int(self._all["id"][best])

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self._smpl, self._end if token in self._ends else token)

    def close(self) -> None:
        if self._smpl:
            C.llama_sampler_free(self._smpl)
            self._smpl = None


class TokenPicker:
    """Picks a token at a batch index; owns a llama.cpp sampler chain when one is needed, and the request's
    grammar gate when it has one."""

    def __init__(
        self,
        ctx: Any,
        model: Any,
        n_vocab: int,
        config: SamplingConfig,
        *,
        backend: bool = False,
        grammar: str | None = None,
        grammar_ends: Sequence[int] = (),
    ) -> None:
        """``grammar_ends``: the engine's own end tokens the vocabulary does not mark (:class:`GrammarGate`)."""
        self.config = config
        self._ctx = ctx
        self._view = LogitsView(ctx, n_vocab)
        self._chain: Any = None
        self._shortlist: Shortlist | None = None
        self._gate: GrammarGate | None = None
        if grammar is not None:
            self._gate = GrammarGate(C.llama_model_get_vocab(model), n_vocab, grammar, grammar_ends)
            backend = False  # a grammar needs the logits on the host
        self.backend = False
        """The chain runs inside llama.cpp's graph on the model's device (``llama_set_sampler``): only the
        sampled token comes back, no logits are read on the host. Must be set before the decode it samples."""
        if config.greedy_fast:  # numpy's argmax on the host, as fast as on the device (measured)
            return
        if backend:
            self._chain = self._build_chain(n_vocab, config)
            self.backend = bool(C.llama_set_sampler(ctx, 0, self._chain))
            if self.backend:
                return
            C.llama_sampler_free(self._chain)  # refused: a chain of its own on the host
        self._chain = self._build_chain(n_vocab, config)
        if Shortlist.applies(config):
            self._shortlist = Shortlist(config.top_k)

    @staticmethod
    def _build_chain(n_vocab: int, cfg: SamplingConfig) -> Any:
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        if cfg.repeat_penalty != 1.0:
            C.llama_sampler_chain_add(
                chain, C.llama_sampler_init_penalties(n_vocab, 64, cfg.repeat_penalty, 0, 0)
            )
        if cfg.temperature <= 0.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
            return chain
        if cfg.top_k > 0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(cfg.top_k))
        if 0.0 < cfg.top_p < 1.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(cfg.top_p, 1))
        if cfg.min_p > 0.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(cfg.min_p, 1))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(cfg.temperature))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(cfg.seed & 0xFFFFFFFF))
        return chain

    def pick(self, row: int, n_rows: int) -> int:
        """The token for output row ``row`` of the last decode, which produced ``n_rows`` output rows (the batch
        index too: the engine asks for logits at the last token alone or at every token of a verification batch)."""
        if self._gate is not None:
            return self._pick_constrained(row, n_rows, self._gate)
        if self._chain is None:
            return int(self._view.rows(n_rows)[row].argmax())
        if self._shortlist is not None:  # never on the backend: no logits on the host
            token = self._shortlist.sample(self._chain, self._view.rows(n_rows)[row])
            if token is not None:
                return token
        # On the backend this returns (and accepts) the token sampled in the graph.
        return int(C.llama_sampler_sample(self._chain, self._ctx, row if n_rows > 1 else -1))

    def _pick_constrained(self, row: int, n_rows: int, gate: GrammarGate) -> int:
        logits = self._view.rows(n_rows)[row]
        if self._chain is None:
            token = int(logits.argmax())
            if not gate.allows(token):
                token = gate.best_allowed(logits)
        else:
            token = self._sample_chain(gate.full(logits))
            if not gate.allows(token):
                token = self._sample_chain(gate.masked(logits))
            C.llama_sampler_accept(self._chain, token)
        gate.accept(token)
        return token

    def _sample_chain(self, arr: Any) -> int:
        C.llama_sampler_apply(self._chain, ctypes.byref(arr))
        if arr.selected < 0:
            raise EngineError("The sampler chose no token (every token was masked).")
        return int(arr.data[arr.selected].id)

    def close(self) -> None:
        if self.backend:
            C.llama_set_sampler(self._ctx, 0, None)
            self.backend = False
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None
        if self._gate is not None:
            self._gate.close()
            self._gate = None


class Shortlist:
    """Runs the sampler chain over the few tokens that can survive its top-k, not the whole vocabulary.

    ``llama_sampler_sample`` hands the chain every token (248,320 for Clover) and top-k then sorts them out:
    about a millisecond per token, a quarter of a GPU decode step. When the chain starts with top-k, only the
    ``k`` largest logits matter, so the tokens within :data:`SPREAD` of the maximum (a numpy comparison over the
    logits, no copy of the vocabulary) are handed to the same chain instead. If fewer than ``k`` tokens are that
    close, or very many are, it falls back to the whole vocabulary. The chain, its seed and its random draws are
    the same, so the sampled tokens are too (up to the order of exactly tied logits).
    """

    SPREAD = 12.0
    """Logits this far below the maximum are kept: a token 12 below the best has e^-12 of its probability."""
    MAX_CANDIDATES = 8192

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self._buf = np.zeros(self.MAX_CANDIDATES, dtype=TOKEN_DATA)
        self._array = token_data_array(self._buf)
        self._array_p = ctypes.pointer(self._array)

    @staticmethod
    def applies(config: SamplingConfig) -> bool:
        """Only for chains that begin with top-k (no repetition penalty, which needs every token)."""
        return config.temperature > 0.0 and config.top_k > 0 and config.repeat_penalty == 1.0

    def sample(self, chain: Any, logits: np.ndarray) -> int | None:
        """The chain's pick among the shortlisted tokens, or None to sample over the whole vocabulary."""
        ids = np.flatnonzero(logits >= logits.max() - self.SPREAD)
        n = len(ids)
        if n < self.top_k or n > self.MAX_CANDIDATES:
            return None
        buf = self._buf
        buf["id"][:n] = ids
        buf["logit"][:n] = logits[ids]
        buf["p"][:n] = 0.0
        arr = self._array
        arr.size, arr.selected, arr.sorted = n, -1, False
        C.llama_sampler_apply(chain, self._array_p)
        token = int(buf["id"][arr.selected])
        C.llama_sampler_accept(chain, token)
        return token


def new_seed() -> int:
    return random.SystemRandom().randrange(0, 2**32 - 1)
