"""The embedded engine for diffusion models: the same :class:`ChatEngine` contract, replies made by
:class:`~clover_local.engine.diffusion.DiffusionRunner` instead of token by token.

Events: a :class:`Refining` after each step (the reply with its masks, for live views; a request's ``live=False``
turns them off) and :class:`TextDelta` as soon as a prefix of the reply has settled (a position never changes once
unmasked, so the settled prefix streams like autoregressive text: block by block on the block schedule, at the
end on the timestep schedule), then one :class:`Finished` with :class:`DiffusionStats`.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator

import numpy as np
from llama_cpp import llama_cpp as C

from clover_local.engine.diffusion import DiffusionResult, DiffusionRunner
from clover_local.engine.diffusion_schedule import DiffusionParams, parse_algorithm
from clover_local.engine.embedded import EmbeddedEngine, EngineParts
from clover_local.engine.textstream import StopTextStream
from clover_local.engine.types import (
    MASK_GLYPH,
    DiffusionStats,
    Finished,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
    Refining,
    Submit,
    TextDelta,
)
from clover_local.errors import ContextFull, EngineError, RequestRefused
from clover_local.plan.diffusion import DiffusionPlan


class DiffusionEngine(EmbeddedEngine):
    """A diffusion GGUF loaded in-process; one reply at a time."""

    def __init__(self, parts: EngineParts, plan: DiffusionPlan) -> None:
        super().__init__(parts)
        self.runner = DiffusionRunner(parts.model, parts.ctx, plan.shift_logits)
        self.plan = plan

    @property
    def submit(self) -> Submit | None:
        """None: a reply is refined on its caller's thread (no batch)."""
        return None

    def reset_cache(self) -> None:
        """Nothing to forget: every step decodes the whole canvas, there is no KV cache."""

    def close(self) -> None:
        self.runner.close()
        super().close()

    def _params(self, n_prompt: int, answer: int, request: GenerationRequest) -> DiffusionParams:
        """The runner's parameters for this request: the canvas is the prompt plus the answer, rounded up to
        whole blocks on the block schedule."""
        plan = self.plan
        canvas = n_prompt + answer
        if plan.schedule == "block":
            canvas = -(-canvas // plan.block_length) * plan.block_length
        limit = min(self.runner.n_ubatch, self.runner.n_ctx)
        if canvas > limit:
            raise ContextFull(
                f"The prompt ({n_prompt} tokens) and a {answer}-token answer need a {canvas}-token canvas; "
                f"this context holds {limit}.",
                "Shorten the conversation, lower the answer length, or load with a larger --ctx.",
            )
        sampling = self._sampling_config(request)
        if plan.schedule == "block":
            steps = plan.steps_per_block * (canvas // plan.block_length)
        else:
            steps = plan.timestep_steps(answer)
        # No seed asked for: a fixed one at temperature 0, so that "deterministic" holds (llama.cpp's diffusion
        # sampler still draws from the top-k/top-p candidates at temperature 0), else a random one.
        fixed = request.seed is None and sampling.temperature == 0.0
        return self.runner.params(
            max_length=canvas,
            steps=steps,
            algorithm=parse_algorithm(plan.algorithm),
            eps=plan.eps if plan.schedule == "timestep" else 0.0,
            block_length=plan.block_length if plan.schedule == "block" else 0,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            seed=0 if fixed else sampling.seed,
        )

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse tools and structured output: no grammar constrains a reply unmasked out of order."""
        if request.tools or request.json_schema is not None:
            raise RequestRefused(
                "Tool calls and structured output are not supported for diffusion models (a grammar cannot "
                "constrain positions unmasked out of order).",
                "Send the request without tools / response_format.",
            )

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        if self._closed:
            raise EngineError("This engine was closed; load the model again.")
        self.check_request(request)
        t0 = time.perf_counter()
        prompt = self._prompt_tokens(request)
        answer = max(1, min(request.max_tokens, self.plan.answer_length))
        params = self._params(len(prompt), answer, request)
        stop = (*request.stop, *(self.turn_markers if request.messages is not None else ()))
        settled = _SettledText(self, params.mask_token_id, stop, answer)
        steps = self.runner.steps(prompt, params, cancel)
        t_first: float | None = None
        while True:
            try:
                view = next(steps)
            except StopIteration as done:
                result: DiffusionResult = done.value
                break
            text = settled.update(view.answer)
            if request.live:
                yield Refining(
                    self.canvas_text(view.answer[settled.n_settled : answer], params.mask_token_id),
                    view.step,
                    view.total_steps,
                    int(np.count_nonzero(view.answer == params.mask_token_id)),
                )
            if text:
                t_first = t_first or time.perf_counter()
                yield TextDelta(text)
        tail = settled.finish()
        if tail:
            t_first = t_first or time.perf_counter()
            yield TextDelta(tail)
        finish: FinishReason = "cancelled" if result.cancelled else ("stop" if settled.ended else "length")
        yield Finished(
            GenerationStats(
                prompt_tokens=len(prompt),
                completion_tokens=settled.n_tokens,
                cached_tokens=0,
                ttft_s=(t_first or time.perf_counter()) - t0,
                prefill_tokens_per_s=0.0,
                decode_tokens_per_s=result.tokens_per_s,
                draft_acceptance=None,
                finish_reason=finish,
                diffusion=DiffusionStats(
                    steps=result.steps_run,
                    answer_tokens=result.unmasked,
                    tokens_per_step=round(result.tokens_per_step, 3),
                    tokens_per_s=round(result.tokens_per_s, 2),
                    algorithm=self.plan.algorithm,
                    schedule=self.plan.schedule,
                    block_length=params.block_length,
                    steps_per_block=params.steps_per_block,
                ),
            )
        )

    def canvas_text(self, answer: np.ndarray, mask_id: int) -> str:
        """The answer as text, masks shown as :data:`MASK_GLYPH` (up to the first end-of-text)."""
        parts: list[str] = []
        for tok in answer.tolist():
            if tok == mask_id:
                parts.append(MASK_GLYPH)
            elif self._is_eog(tok):
                break
            else:
                parts.append(self._piece_of(tok).decode("utf-8", errors="replace"))
        return "".join(parts)

    def detokenize(self, tokens: list[int]) -> str:
        """Text of ``tokens`` as llama-diffusion-cli prints it (``common_detokenize(vocab, tokens, false)``:
        control tokens, masks included, print nothing)."""
        arr = (C.llama_token * max(1, len(tokens)))(*tokens)
        size = max(64, 8 * len(tokens))
        buf = ctypes.create_string_buffer(size)
        n = C.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, False)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = C.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, False)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")


class _SettledText:
    """Text of the reply's settled prefix (up to the first mask), streamed once, stopped at end-of-text."""

    def __init__(self, engine: DiffusionEngine, mask_id: int, stop: tuple[str, ...], limit: int) -> None:
        self._engine = engine
        self._mask = mask_id
        self._limit = limit
        """At most this many tokens: the canvas may be longer (rounded up to whole blocks)."""
        self._stream = StopTextStream(stop)
        self.n_settled = 0
        """Answer positions already streamed as text (the live view shows the rest)."""
        self.n_tokens = 0
        self.ended = False

    def update(self, answer: np.ndarray) -> str:
        if self.ended or self._stream.stopped:
            return ""
        answer = answer[: self._limit]
        masked = np.flatnonzero(answer[self.n_settled :] == self._mask)
        end = self.n_settled + (int(masked[0]) if len(masked) else len(answer) - self.n_settled)
        out: list[str] = []
        for tok in answer[self.n_settled : end].tolist():
            if self._engine._is_eog(tok):
                self.ended = True
                break
            self.n_tokens += 1
            out.append(self._stream.push(self._engine._piece_of(tok)))
            if self._stream.stopped:
                self.ended = True
                break
        self.n_settled = end
        return "".join(out)

    def finish(self) -> str:
        return self._stream.flush()
