"""The embedded engine: a GGUF loaded in-process through llama-cpp-python's low-level API, generating with
self-speculative (n-gram) decoding.

One step decodes the last token alone, or with a drafted continuation, keeping the longest drafted prefix the
model agrees with plus its own next token; logits only for the verified positions (memory O(draft x vocab)), and
rejected positions removed from the KV cache. On recurrent/hybrid models an n-gram draft is rolled back as
llama-server does it (``engine.checkpoints.DraftRollback``); the MTP head uses llama.cpp's recurrent-state
snapshots (``n_rs_seq``) instead. The KV cache of the previous turn is reused for the next prompt's shared prefix.

``serve`` and the chat hand requests straight to the engine's one batch thread (``engine.scheduler``, which runs
``plan.parallel`` slots at once) through ``submit``; ``generate`` does too with several slots.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as C

from clover_local.engine import grammar, templates, toolcalls
from clover_local.engine.batch_threads import LoadThreads
from clover_local.engine.checkpoints import TAIL_TOKENS, Checkpoints, DraftRollback
from clover_local.engine.drafter import DraftController, Drafter, default_drafter
from clover_local.engine.sampling import SamplingConfig, TokenPicker, new_seed
from clover_local.engine.scheduler import Job, SlotScheduler
from clover_local.engine.sequence import ActiveSequence, Slot, common_prefix
from clover_local.engine.templates import TemplateChoice, renderer
from clover_local.engine.types import (
    END,
    ChatMessage,
    Finished,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
    MeasuredCosts,
    Prepare,
    RunnerHealth,
    Sink,
    Submit,
    ToolFormat,
)
from clover_local.engine.verify_probe import measure_batch_costs
from clover_local.errors import ContextFull, EngineError, UsageError
from clover_local.plan.reasons import Notice
from clover_local.plan.types import SpeculativePlan
from clover_local.presets import SamplingDefaults


@dataclass
class EngineParts:
    """What the loader hands over: llama.cpp handles and the choices made while loading."""

    model: Any
    ctx: Any
    model_name: str
    template: TemplateChoice
    sampling: SamplingDefaults
    speculative: SpeculativePlan
    recurrent: bool
    keep_alive: list[Any] = field(default_factory=list)
    backend_sampling: bool = False
    notices: list[Notice] = field(default_factory=list)
    mtp: Any = None
    """The MTP draft head (``engine.mtp.MtpHead``) when the plan drafts with it; None otherwise."""
    ctx_checkpoints: int = 0
    """Context checkpoints to keep on a recurrent or hybrid model (``engine.checkpoints``; the plan's count)."""


class EmbeddedEngine:
    """:class:`clover_local.engine.types.ChatEngine` on llama-cpp-python's ctypes API: one generation at a time
    with one slot; with several (``slots``), that many at once from as many threads."""

    def __init__(self, parts: EngineParts) -> None:
        self._parts = parts
        self.model_name = parts.model_name
        self.template = parts.template
        self.tool_format: ToolFormat = templates.tool_format(parts.template)
        self.recurrent = parts.recurrent
        """The model keeps a recurrent state (Mamba, Gated DeltaNet...), alone or beside attention."""
        self.speculative = parts.speculative
        """The plan's speculation (its batch costs this machine's once :meth:`measure_verify_costs` kept them)."""
        self._model = parts.model
        self._ctx = parts.ctx
        self._vocab = C.llama_model_get_vocab(parts.model)
        self._n_vocab = int(C.llama_vocab_n_tokens(self._vocab))
        self.slots = max(1, int(C.llama_n_seq_max(parts.ctx)))
        # Each slot's own share of the cache (llama.cpp splits -c evenly between the sequences).
        self.n_ctx = int(C.llama_n_ctx(parts.ctx)) if self.slots == 1 else int(C.llama_n_ctx_seq(parts.ctx))
        self.slots_state = [Slot(i) for i in range(self.slots)]
        """Each slot's sequence id and cached tokens (the scheduler hands them out)."""
        self._batch_seq = -1
        """The sequence id every row of the batch carries now (-1: mixed, after a batch of several, or none yet)."""
        self._n_batch = int(C.llama_n_batch(parts.ctx))
        self._mem = C.llama_get_memory(parts.ctx)
        self._n_swa = int(C.llama_model_n_swa(parts.model))
        self._bos = int(C.llama_vocab_bos(self._vocab))
        self._batch = C.llama_batch_init(self._n_batch, 0, 1)
        self._b_token = np.ctypeslib.as_array(self._batch.token, shape=(self._n_batch,))
        self._b_pos = np.ctypeslib.as_array(self._batch.pos, shape=(self._n_batch,))
        self._b_logits = np.ctypeslib.as_array(self._batch.logits, shape=(self._n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self._n_batch,))[:] = 1
        self._piece_buf = ctypes.create_string_buffer(512)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._marker_ends: tuple[int, ...] = ()
        """Turn markers this engine ends a reply at that the vocabulary does not mark end-of-generation."""
        self._spec_broken = False
        self.notices: list[Notice] = list(parts.notices)
        self._render = renderer(
            parts.template,
            bos_token=self._special_text(self._bos),
            eos_token=self._special_text(int(C.llama_vocab_eos(self._vocab))),
        )
        templates.check_template(self._render)
        self.turn_markers = self._find_turn_markers()
        """The control text of this engine's chat template (``templates.turn_markers``)."""
        self._closed = False
        self.backend_sampling = parts.backend_sampling and self.slots == 1
        """Sample inside llama.cpp's graph on the model's device (GPU plans) instead of on the host (one slot:
        the graph's sampler is set per sequence)."""
        self._mtp = parts.mtp
        if self._mtp is not None and self.slots > 1:
            # The head keeps one sequence's hidden states; with several slots it would follow none of them.
            self._mtp.close()
            self._mtp = None
            self.notices.append(
                Notice(
                    "speculation-off",
                    "MTP drafting runs only with one slot in the embedded engine: off for these "
                    f"{self.slots} slots (--parallel 1 keeps it); n-gram drafting is not affected.",
                )
            )
        self._scheduler = SlotScheduler(self)
        self.threads = LoadThreads(
            lambda t, tb: C.llama_set_n_threads(parts.ctx, t, tb),
            int(C.llama_n_threads(parts.ctx)),
            int(C.llama_n_threads_batch(parts.ctx)),
        )
        """Steps get every planned thread only while other programs leave the cores free."""
        # The MTP head keeps a context of its own, which a checkpoint of the trunk would not put back.
        limit = parts.ctx_checkpoints if self.recurrent and self._mtp is None else 0
        self.checkpoints = [Checkpoints(parts.ctx, limit, slot.seq) for slot in self.slots_state]
        """Each slot's recurrent state at prompt positions, restored when its next prompt shares them."""
        keeps_snapshots = int(C.llama_n_rs_seq(parts.ctx)) > 0
        self._rollbacks = [
            DraftRollback(parts.ctx, slot.seq) if self.recurrent and not keeps_snapshots else None
            for slot in self.slots_state
        ]
        """On a recurrent model without llama.cpp's snapshots: each slot's state kept while a draft is verified."""
        self.drafter_factory: Callable[[SpeculativePlan], Drafter] = default_drafter
        """Makes the drafter for each generation (tests swap in drafters that guess on purpose)."""

    # --- ChatEngine -------------------------------------------------------------------------------------------

    @property
    def drafts_rolled_back(self) -> int:
        """Drafts rejected in part and rolled back from a copy of the recurrent state (tests, benchmarks)."""
        return sum(r.restored for r in self._rollbacks if r is not None)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text, add_special=False))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._scheduler.close()
        if self._mtp is not None:
            self._mtp.close()
        C.llama_batch_free(self._batch)
        C.llama_free(self._ctx)
        C.llama_model_free(self._model)

    def reset_cache(self) -> None:
        """Forget the KV cache (the next prompt is evaluated from scratch)."""
        self._forget(None)
        if self._mtp is not None:
            self._mtp.clear()

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str:
        return self._render(messages)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (C.llama_token * n_max)()
        n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (C.llama_token * n_max)()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        tokens = list(buf[:n])
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self._bos:
            del tokens[0]  # the template wrote <bos> and the tokenizer added one too
        return tokens

    @property
    def submit(self) -> Submit | None:
        """The batch thread, taking requests straight from ``serve``'s queue."""
        return self._submit

    def _submit(
        self, request: GenerationRequest, cancel: threading.Event, sink: Sink, prepare: Prepare | None
    ) -> None:
        """Hand ``request`` to the batch thread, which prepares it, runs it and gives its items to ``sink``."""
        self._scheduler.submit(Job(request, cancel, self._split_calls(request, sink), prepare=prepare))

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        """One slot: the sequence steps on the caller's thread, each token read before the next is made (``run``,
        ``bench``; a cancel set on reading a token stops the next). Several: :meth:`submit`, read from a queue."""
        if self.slots == 1:
            yield from self._generate_alone(request, cancel)
            return
        items: queue.SimpleQueue[object] = queue.SimpleQueue()
        job = Job(request, cancel, self._split_calls(request, items.put))
        self._scheduler.submit(job)
        item = None
        try:
            while (item := items.get()) is not END:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            job.abort.set()  # a no-op when it ended; else it ends at the next step
            while item is not END:  # then the batch no longer uses its slot
                item = items.get()

    def _generate_alone(
        self, request: GenerationRequest, cancel: threading.Event | None
    ) -> Iterator[GenerationEvent]:
        if self._closed:
            raise EngineError("This engine was closed; load the model again.")
        seq = self.open_sequence(request, cancel, time.perf_counter())
        seq.slot = self.slots_state[0]
        try:
            events = self._steps_alone(seq)
            if toolcalls.shown_tools(request):
                events = toolcalls.split_events(events, self.tool_format, request.tools)
            yield from events
        finally:
            seq.picker.close()

    def _steps_alone(self, seq: ActiveSequence) -> Iterator[GenerationEvent]:
        if not self.start_sequence(seq):
            seq.stop("cancelled")
        while not seq.done:
            yield from seq.emit(seq.new)
            if not seq.done:
                self.step_alone(seq)
        yield from seq.tail()
        yield self.finished(seq)

    def _split_calls(self, request: GenerationRequest, sink: Sink) -> Sink:
        """``sink`` with the tool calls taken out of the text, where the request shows tools."""
        tools = toolcalls.shown_tools(request)
        return toolcalls.CallSink(self.tool_format, tools, sink) if tools else sink

    def open_sequence(
        self, request: GenerationRequest, cancel: threading.Event | None, t0: float
    ) -> ActiveSequence:
        """``request``'s sequence, ready to start: its prompt tokenized, its stops and sampler made."""
        prompt = self._prompt_tokens(request)
        if len(prompt) >= self.n_ctx:
            raise ContextFull(
                f"The prompt is {len(prompt)} tokens; the context holds {self.n_ctx}.",
                "Shorten the conversation or plan a larger context (--ctx).",
            )
        max_new = min(request.max_tokens, self.n_ctx - len(prompt))
        gbnf = self._grammar(request)
        if request.messages is not None:  # a chat reply ends where its turn ends, and after its one call
            # Under a grammar the grammar says where the reply ends: a turn marker's text inside a JSON string
            # is text, not the end of the turn (the soak's one embedded miss ended a forced call there).
            markers = self.turn_markers if gbnf is None else ()
            stops = toolcalls.reply_stop_strings(request, markers, under_grammar=gbnf is not None)
            request = replace(request, stop=stops)
        plan = self.speculative
        asked = plan.enabled if request.speculative is None else request.speculative
        spec = bool(asked) and not self._spec_broken
        drafter = self.drafter_factory(plan) if spec and self._mtp is None else None
        picker = TokenPicker(  # last: nothing after it fails, so nothing leaves it unfreed
            self._ctx,
            self._model,
            self._n_vocab,
            self._sampling_config(request),
            backend=self.backend_sampling,
            grammar=gbnf,
            grammar_ends=self._marker_ends,
        )
        seq = ActiveSequence(
            request,
            prompt,
            max_new,
            picker,
            cancel,
            t0,
            is_eog=self._is_eog,
            piece=self._piece_of,
            controller=DraftController(plan.n_min, plan.n_max, plan.batch_costs),
            drafter=drafter,
        )
        seq.mtp = self._mtp if spec else None
        return seq

    # --- one sequence ------------------------------------------------------------------------------------------

    def start_sequence(self, seq: ActiveSequence) -> bool:
        """Reuse the slot's cached prefix, evaluate the rest of the prompt and pick the first token
        (``seq.new``); False when cancelled meanwhile."""
        slot = seq.slot
        assert slot is not None
        if not seq.request.cache_prompt:
            self._forget(slot)
        n_cached = seq.n_cached = self._reuse_prefix(slot, seq.prompt)
        prompt = seq.prompt
        if not self._evaluate_prompt(slot, prompt, n_cached, seq.cancel):
            self.checkpoints[slot.seq].forget_after(n_cached)
            if not C.llama_memory_seq_rm(self._mem, slot.seq, n_cached, -1):
                self._forget(slot)
            del slot.kv[n_cached:]
            seq.t_prefill = seq.t0
            return False
        slot.kv.extend(prompt[n_cached:])
        seq.t_prefill = time.perf_counter()
        seq.new = [seq.picker.pick(0, 1)]
        if seq.drafter is not None:
            seq.drafter.reset(prompt)
            seq.drafter.extend(seq.new)
        return True

    def _evaluate_prompt(
        self, slot: Slot, prompt: list[int], n_cached: int, cancel: threading.Event | None
    ) -> bool:
        """Evaluate the prompt after its cached tokens in the slot; on a model with checkpoints, keep one at its
        end (the next turn's prompt starts with this one when the client resends the history as it was) and one
        :data:`TAIL_TOKENS` before (when the history ends its last turn differently)."""
        checkpoints = self.checkpoints[slot.seq]
        cut = len(prompt) - TAIL_TOKENS
        if checkpoints.limit <= 0 or cut <= n_cached:
            return self._decode(prompt[n_cached:], n_cached, all_logits=False, cancel=cancel, seq=slot.seq)
        if not self._decode(prompt[n_cached:cut], n_cached, all_logits=False, cancel=cancel, seq=slot.seq):
            return False
        checkpoints.save(cut)
        if not self._decode(prompt[cut:], cut, all_logits=False, cancel=cancel, seq=slot.seq):
            return False
        checkpoints.save(len(prompt))
        return True

    def step_alone(self, seq: ActiveSequence) -> None:
        """One step of a sequence decoded alone: its last token, with a drafted continuation when drafting
        pays; ``seq.new`` becomes what the step picked."""
        slot = seq.slot
        assert slot is not None
        kv, plan = slot.kv, self.speculative
        last = seq.new[-1]
        base = len(kv)
        if base + 1 > self.n_ctx:
            seq.stop("length")
            return
        mtp, drafter, controller = seq.mtp, seq.drafter, seq.controller
        draft: list[int] = []
        if mtp is not None and not self._spec_broken:
            # llama-server's budget (get_n_draft_max): what the reply and the context still allow.
            draft = mtp.draft(last, base, min(seq.max_new - seq.n_out - 1, self.n_ctx - base - 2))
        elif drafter is not None and not self._spec_broken:
            room = min(seq.max_new - seq.n_out - 1, self.n_ctx - base - 1, self._n_batch - 1)
            if room >= controller.n_min:
                candidate = drafter.draft(min(plan.n_max, room))
                draft = candidate[: controller.choose(len(candidate), drafter.last_match)]
        if not draft:
            self._decode([last], base, all_logits=False, seq=slot.seq)
            kv.append(last)
            new = [seq.picker.pick(0, 1)]
        else:
            new = self._verify(slot, last, draft, base, seq.picker)
            if mtp is not None:
                mtp.accept(len(new) - 1)
            match = drafter.last_match if drafter is not None else 0
            controller.record(len(draft), len(new) - 1, match_size=match)
        if drafter is not None:
            drafter.extend(new)
        seq.new = new

    def step_batch(self, seqs: Sequence[ActiveSequence]) -> None:
        """One step of several sequences in one ``llama_decode``: each one's last token in its own slot, rows
        in slot order (llama.cpp splits a batch of per-slot streams by consecutive sequence ids); each picks
        its next token from its own row."""
        rows = sorted(seqs, key=lambda q: q.slot.seq if q.slot is not None else 0)
        slots = [q.slot for q in rows if q.slot is not None]
        n = len(rows)
        for i, (q, slot) in enumerate(zip(rows, slots, strict=True)):
            self._b_token[i] = q.new[-1]
            self._b_pos[i] = len(slot.kv)
            self._batch.seq_id[i][0] = slot.seq
        self._b_logits[:n] = 1
        self._batch_seq = -1
        self._batch.n_tokens = n
        self._llama_decode(slots, "a batch", "Plan a larger --ctx or fewer --parallel.")
        for i, (q, slot) in enumerate(zip(rows, slots, strict=True)):
            slot.kv.append(q.new[-1])
            q.new = [q.picker.pick(i, n)]
            if q.drafter is not None:
                q.drafter.extend(q.new)

    def finished(self, seq: ActiveSequence) -> Finished:
        """The sequence's last event: its counters and why it ended."""
        t_end, controller = time.perf_counter(), seq.controller
        n_prefill = len(seq.prompt) - seq.n_cached
        t_first = seq.t_first if seq.t_first is not None else t_end
        decode_s = t_end - t_first
        return Finished(
            GenerationStats(
                prompt_tokens=len(seq.prompt),
                completion_tokens=seq.n_out,
                cached_tokens=seq.n_cached,
                ttft_s=t_first - seq.t0,
                prefill_tokens_per_s=n_prefill / (seq.t_prefill - seq.t0) if seq.t_prefill > seq.t0 else 0.0,
                decode_tokens_per_s=(seq.n_out - 1) / decode_s if seq.n_out > 1 and decode_s > 0 else 0.0,
                draft_acceptance=controller.acceptance,
                drafted_tokens=controller.drafted,
                accepted_tokens=controller.accepted,
                finish_reason=seq.finish,
            )
        )

    def _forget(self, slot: Slot | None) -> None:
        """Drop a slot's cache (the whole memory for None, or on a one-slot engine)."""
        slots = self.slots_state
        if slot is not None and self.slots > 1 and C.llama_memory_seq_rm(self._mem, slot.seq, -1, -1):
            slots = [slot]
        else:
            C.llama_memory_clear(self._mem, True)
        for each in slots:
            each.kv.clear()
            self.checkpoints[each.seq].clear()

    def _is_eog(self, tok: int) -> bool:
        is_eog = self._eog.get(tok)
        if is_eog is None:
            is_eog = self._eog[tok] = bool(C.llama_vocab_is_eog(self._vocab, tok))
        return is_eog

    def _verify(self, slot: Slot, last: int, draft: list[int], base: int, picker: TokenPicker) -> list[int]:
        """Decode ``last`` + ``draft`` in one batch; return the accepted drafted tokens plus the model's next."""
        kv = slot.kv
        batch = [last, *draft]
        rollback = self._rollbacks[slot.seq]
        if rollback is not None and not rollback.save():
            rollback = None  # no copy: a rejection then finds seq_rm refused (_recover_from_failed_rollback)
        self._decode(batch, base, all_logits=True, seq=slot.seq)
        kv.extend(batch)
        n_rows = len(batch)
        new: list[int] = []
        for i in range(n_rows):
            new.append(picker.pick(i, n_rows))
            if i == len(draft) or new[-1] != draft[i]:
                break
        n_keep = base + len(new)
        if n_keep < len(kv):
            if rollback is not None:
                self._replay(slot, rollback, base, batch[: len(new)])
            elif not C.llama_memory_seq_rm(self._mem, slot.seq, n_keep, -1):
                self._recover_from_failed_rollback(slot, n_keep)
            del kv[n_keep:]
            if self._mtp is not None:
                self._mtp.truncate(n_keep)
        return new

    def _replay(self, slot: Slot, rollback: DraftRollback, base: int, kept: list[int]) -> None:
        """Part of a draft was rejected on a recurrent model without snapshots: put back the state from before the
        batch, drop the batch's attention cells, and evaluate the kept tokens again (their logits were already
        used: only the state they leave matters)."""
        if not rollback.restore() or not C.llama_memory_seq_rm(self._mem, slot.seq, base, -1):
            self._recover_from_failed_rollback(slot, base + len(kept))
            return
        self._decode(kept, base, all_logits=False, seq=slot.seq)

    def _recover_from_failed_rollback(self, slot: Slot, n_keep: int) -> None:
        """llama.cpp could not drop the rejected draft (a recurrent state without snapshots): rebuild the cache
        from the kept tokens and stop speculating on this engine."""
        kept = slot.kv[:n_keep]
        self._forget(slot)
        if self._mtp is not None:
            self._mtp.clear()
        self._decode(kept, 0, all_logits=False, seq=slot.seq)
        slot.kv.extend(kept)
        self._spec_broken = True
        self.notices.append(
            Notice(
                "speculation-off",
                "Speculative decoding was switched off: llama.cpp could not roll back this model's recurrent "
                "state.",
            )
        )

    def _decode(
        self,
        tokens: Sequence[int],
        start: int,
        *,
        all_logits: bool,
        cancel: threading.Event | None = None,
        seq: int = 0,
    ) -> bool:
        """Evaluate ``tokens`` at positions ``start``... of sequence ``seq``; logits for every token or only the
        last. Chunks by ``n_batch``; returns False when cancelled between chunks."""
        n = len(tokens)
        if seq != self._batch_seq:
            for i in range(self._n_batch):
                self._batch.seq_id[i][0] = seq
            self._batch_seq = seq
        for off in range(0, n, self._n_batch):
            if cancel is not None and cancel.is_set():
                return False
            m = min(self._n_batch, n - off)
            self._b_token[:m] = tokens[off : off + m]
            self._b_pos[:m] = np.arange(start + off, start + off + m)
            self._b_logits[:m] = 1 if all_logits else 0
            if off + m == n:
                self._b_logits[m - 1] = 1
            self._batch.n_tokens = m
            self._llama_decode(
                [self.slots_state[seq]], "the prompt", "Start a new chat or plan a larger --ctx."
            )
            if self._mtp is not None:
                self._mtp.process(tokens[off : off + m], start + off)
        return True

    def _llama_decode(self, slots: Sequence[Slot], what: str, fix: str) -> None:
        """``llama_decode`` of the batch as filled; when it fails, the slots in it are forgotten and the error
        says ``what`` could not be evaluated (``fix``: what to do when the context is full)."""
        self.threads.before_step()
        rc = C.llama_decode(self._ctx, self._batch)
        if rc == 0:
            return
        for slot in slots:
            self._forget(slot)
        if rc == 1:
            raise EngineError("The context is full (no room in the KV cache).", fix)
        raise EngineError(f"llama.cpp failed to evaluate {what} (llama_decode returned {rc}).")

    # --- measuring ---------------------------------------------------------------------------------------------

    def measure_verify_costs(self, n_max_batch: int) -> MeasuredCosts | None:
        if self.n_ctx < n_max_batch + 7:
            return None
        measured = measure_batch_costs(self, n_max_batch)
        if measured.quiet:
            self.speculative = replace(self.speculative, batch_costs=measured.costs)
        return measured

    def health(self) -> RunnerHealth:
        return RunnerHealth()

    @property
    def runner_pid(self) -> int | None:
        return None

    def time_batches(
        self, context: Sequence[int], sizes: Sequence[int], rounds: int, budget_s: float
    ) -> dict[int, list[float]]:
        """Seconds llama.cpp takes to evaluate a batch of ``m`` tokens with logits on every row (what verifying
        ``m - 1`` drafted tokens costs) after ``context``, for each ``m`` in ``sizes``, interleaved over
        ``rounds`` (fewer once ``budget_s`` is spent, never fewer than two), with batches on the planned decode
        threads whatever the load (the table is a ratio of batch to one-token cost on the same threads). On a
        recurrent model without snapshots a batch includes copying the state it would be rolled back to.
        The cache is empty afterwards."""
        self.reset_cache()
        base = len(context)
        times: dict[int, list[float]] = {m: [] for m in sizes}
        follow = list(context[: max(sizes)]) or [self._bos]
        rollback = self._rollbacks[0]
        started = time.perf_counter()
        try:
            with self.threads.pinned(self.threads.threads):
                self._decode(context, 0, all_logits=False)
                for r in range(rounds):
                    if r >= 2 and time.perf_counter() - started > budget_s:
                        break
                    for m in sizes:
                        batch = (follow * (m // len(follow) + 1))[:m]
                        t0 = time.perf_counter()
                        if m > 1 and rollback is not None:
                            rollback.save()  # part of verifying a draft on this engine
                        self._decode(batch, base, all_logits=m > 1)
                        times[m].append(time.perf_counter() - t0)
                        if not C.llama_memory_seq_rm(self._mem, 0, base, -1):
                            # A recurrent state without snapshots cannot drop the batch: evaluate the context again.
                            C.llama_memory_clear(self._mem, True)
                            self._decode(context, 0, all_logits=False)
        finally:
            self.reset_cache()
        return times

    # --- prompt and cache -------------------------------------------------------------------------------------

    def _prompt_tokens(self, request: GenerationRequest) -> list[int]:
        if (request.messages is None) == (request.prompt is None):
            raise UsageError("A generation request needs exactly one of messages and prompt.")
        text = request.prompt
        if text is None:
            tools = toolcalls.shown_tools(request)
            text = self._render(request.messages or (), tools=tools, tool_choice=request.tool_choice)
        tokens = self.tokenize(text, add_special=True, parse_special=True)
        if not tokens:
            raise UsageError("The prompt is empty.")
        return tokens

    def _reuse_prefix(self, slot: Slot, prompt: list[int]) -> int:
        """Keep the slot's KV cache of the longest shared prefix (at least one prompt token is always
        re-evaluated, for its logits). Returns how many prompt tokens are already in the cache."""
        kv = slot.kv
        n_keep = min(common_prefix(kv, prompt), len(prompt) - 1)
        if n_keep > 0 and n_keep < len(kv) and not C.llama_memory_seq_rm(self._mem, slot.seq, n_keep, -1):
            # The recurrent state cannot be cut back: restore its latest checkpoint inside the prefix and drop the
            # attention cache after it (none: evaluate from the start).
            n_keep = self.checkpoints[slot.seq].restore(n_keep)
            if n_keep and not C.llama_memory_seq_rm(self._mem, slot.seq, n_keep, -1):
                n_keep = 0
        if n_keep > 0:
            # A sliding-window or recurrent cache may no longer hold what the shared prefix needs.
            pos_min = int(C.llama_memory_seq_pos_min(self._mem, slot.seq))
            if pos_min > max(0, n_keep - max(1, self._n_swa)):
                n_keep = 0
        if n_keep == 0:
            self._forget(slot)
        else:
            del kv[n_keep:]
        self.checkpoints[slot.seq].forget_after(n_keep)
        if self._mtp is not None:
            self._mtp.truncate(n_keep)
        return n_keep

    # --- helpers ----------------------------------------------------------------------------------------------

    def _find_turn_markers(self) -> tuple[str, ...]:
        """The template's turn markers; each that is one token of this vocabulary ends generation like an
        end-of-generation token, even when the GGUF does not mark it so (a start of turn never is)."""
        markers = templates.probe_turn_markers(self._render, (EngineError,))
        for marker in markers:
            ids = self.tokenize(marker, add_special=False, parse_special=True)
            if len(ids) == 1:
                if not self._is_eog(ids[0]):  # the grammar must know it ends the reply (sampling.GrammarGate)
                    self._marker_ends = (*self._marker_ends, ids[0])
                self._eog[ids[0]] = True
        return markers

    def check_request(self, request: GenerationRequest) -> None:
        """Build the request's grammar now, so that a schema it cannot enforce is refused before a reply starts."""
        self._grammar(request)

    def _grammar(self, request: GenerationRequest) -> str | None:
        """The GBNF this request's output must follow: its JSON schema, or a forced tool call."""
        if request.json_schema is not None:
            return grammar.json_grammar(request.json_schema)
        return toolcalls.call_grammar(request, self.tool_format)

    def _sampling_config(self, request: GenerationRequest) -> SamplingConfig:
        d = self._parts.sampling
        temperature = d.temperature if request.temperature is None else request.temperature
        if temperature < 0:
            raise UsageError(f"Temperature must be 0 or more, not {temperature}.")
        return SamplingConfig(
            temperature=float(temperature),
            top_k=d.top_k if request.top_k is None else request.top_k,
            top_p=d.top_p if request.top_p is None else request.top_p,
            min_p=d.min_p if request.min_p is None else request.min_p,
            repeat_penalty=d.repeat_penalty,
            seed=new_seed() if request.seed is None else request.seed,
        )

    def _piece_of(self, token: int, *, special: bool = False) -> bytes:
        """The token's bytes (control tokens as their text when ``special``); plain pieces are cached."""
        piece = None if special else self._pieces.get(token)
        if piece is not None:
            return piece
        n = C.llama_token_to_piece(self._vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        if n < 0:
            self._piece_buf = ctypes.create_string_buffer(-n + 1)
            n = C.llama_token_to_piece(self._vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        piece = self._piece_buf.raw[:n]
        if not special:
            self._pieces[token] = piece
        return piece

    def _special_text(self, token: int) -> str:
        return self._piece_of(token, special=True).decode("utf-8", errors="replace") if token >= 0 else ""
