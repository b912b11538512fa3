"""Choosing the next token from logits: greedy with numpy straight on llama.cpp's logits buffer (no copy), or
llama.cpp's own sampler chain (top-k, top-p, min-p, temperature, seeded RNG) for everything else.

Both pick by *batch index*, so a speculative verification batch samples each drafted position in order; every
emitted token consumes exactly one sample, so a seeded run gives the same tokens with and without speculation
(up to llama.cpp's batched-vs-single numerical differences).
"""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from llama_cpp import llama_cpp as C


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
    """Numpy views of the context's logits buffer, cached while llama.cpp keeps the same buffer."""

    def __init__(self, ctx: Any, n_vocab: int) -> None:
        self._ctx = ctx
        self._n_vocab = n_vocab
        self._key: tuple[int, int] = (0, 0)
        self._array: np.ndarray | None = None

    def rows(self, n_rows: int) -> np.ndarray:
        ptr = C.llama_get_logits(self._ctx)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value or 0
        if (addr, n_rows) != self._key or self._array is None:
            buf = (ctypes.c_float * (n_rows * self._n_vocab)).from_address(addr)
            # A ctypes array exposes the buffer protocol: no copy.
            self._array = np.frombuffer(cast(bytes, buf), dtype=np.float32).reshape(n_rows, self._n_vocab)
            self._key = (addr, n_rows)
        return self._array


class TokenPicker:
    """Picks a token at a batch index; owns a llama.cpp sampler chain when one is needed."""

    def __init__(
        self, ctx: Any, model: Any, n_vocab: int, config: SamplingConfig, *, backend: bool = False
    ) -> None:
        self.config = config
        self._ctx = ctx
        self._view = LogitsView(ctx, n_vocab)
        self._chain: Any = None
        self._shortlist: Shortlist | None = None
        self.backend = False
        """The chain runs inside llama.cpp's graph on the model's device (``llama_set_sampler``): only the
        sampled token comes back, no logits are read on the host. Must be set before the decode it samples."""
        if backend:
            self._chain = self._build_chain(n_vocab, config)
            self.backend = bool(C.llama_set_sampler(ctx, 0, self._chain))
            if self.backend:
                return
            C.llama_sampler_free(self._chain)
            self._chain = None
        if not config.greedy_fast:
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
        """The token for output row ``row`` of the last decode, which produced ``n_rows`` output rows.

        Output rows and batch indices coincide here: the engine asks for logits either at the last token
        (one row) or at every token of a verification batch.
        """
        if self._chain is None:
            return int(self._view.rows(n_rows)[row].argmax())
        if self.backend:  # llama_sampler_sample returns (and accepts) the token sampled in the graph
            return int(C.llama_sampler_sample(self._chain, self._ctx, row if n_rows > 1 else -1))
        if self._shortlist is not None:
            token = self._shortlist.sample(self._chain, self._view.rows(n_rows)[row])
            if token is not None:
                return token
        idx = row if n_rows > 1 else -1
        return int(C.llama_sampler_sample(self._chain, self._ctx, idx))

    def close(self) -> None:
        if self.backend:
            C.llama_set_sampler(self._ctx, 0, None)
            self.backend = False
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None


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
        self._buf = np.zeros(self.MAX_CANDIDATES, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        self._array = C.llama_token_data_array(
            data=ctypes.cast(self._buf.ctypes.data, C.llama_token_data_p),
            size=0,
            selected=-1,
            sorted=False,
        )
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
