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

    def __init__(self, ctx: Any, model: Any, n_vocab: int, config: SamplingConfig) -> None:
        self.config = config
        self._ctx = ctx
        self._view = LogitsView(ctx, n_vocab)
        self._chain: Any = None
        if not config.greedy_fast:
            self._chain = self._build_chain(n_vocab, config)

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
        idx = row if n_rows > 1 else -1
        return int(C.llama_sampler_sample(self._chain, self._ctx, idx))

    def close(self) -> None:
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None


def new_seed() -> int:
    return random.SystemRandom().randrange(0, 2**32 - 1)
