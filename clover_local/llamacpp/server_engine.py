"""``LlamaServerEngine``: the ``ChatEngine`` protocol over a running ``llama-server``'s HTTP API, so the
TUI chat, ``bench`` and ``serve`` can use an upstream build exactly as they use the embedded engine.

Chat goes to ``/v1/chat/completions`` (the server applies the chat template), plain prompts to
``/completion``; both stream, and the last event's ``timings`` give the stats (prompt and decode speed,
cached prompt tokens, drafted and accepted tokens of speculative decoding). Chat requests llama-server would
not enforce take clover-local's route instead (:mod:`.server_tools`).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from clover_local.engine import templates, toolcalls
from clover_local.engine.templates import TemplateChoice
from clover_local.engine.types import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
    RunnerHealth,
    TextDelta,
    ToolCallMade,
    ToolFormat,
    ToolSpec,
)
from clover_local.errors import RequestRefused, RunnerDied, RunnerUnavailable, ServerError
from clover_local.llamacpp import http_client
from clover_local.llamacpp.load_follow import CpuLookout, FollowLoad, LoadFollower, LoadLookout, RequestGate
from clover_local.llamacpp.restart_policy import RestartPolicy
from clover_local.llamacpp.server import LlamaServerProcess
from clover_local.llamacpp.server_args import split_flags, threads_in, with_threads
from clover_local.llamacpp.server_tools import (
    ToolCallCollector,
    agent_payload,
    clover_enforces,
    completion_payload,
    openai_message,
    schema_fields,
    withhold_unfinished,
)
from clover_local.llamacpp.slot_files import forget_slots, restore_slots, save_slots
from clover_local.llamacpp.supervisor import Supervisor
from clover_local.presets import SamplingDefaults

DEFAULT_RESTARTS = RestartPolicy()


class LlamaServerEngine:
    """A ``ChatEngine`` backed by the ``llama-server`` child ``process``.

    With ``owns_process`` the child is supervised (started again when it stops unasked,
    :mod:`~clover_local.llamacpp.supervisor`, as ``restarts`` says) and ``close()`` stops it. While it restarts,
    requests raise :class:`RunnerUnavailable` (``serve``: a 503 with ``Retry-After``); one in flight when it
    stopped raises :class:`RunnerDied`. Speculative decoding is set when the server starts (``--spec-type``);
    ``request.speculative`` cannot change it per request and is ignored. ``template`` (the chat template the
    server was started with, as ``templates.choose_template`` chose it) and ``n_ctx`` (each slot's context:
    ``-c`` split by ``-np``) come from the launch; only a server started without one (a test's, a benchmark's)
    is asked its ``/props`` for them. ``follow_load``: start the supervised child again with other threads as
    the machine's load changes (``load_follow``), reading the load from ``load_lookout`` (tests give a scripted
    one; default: the machine's CPU times)."""

    submit = None
    """Each request is an HTTP stream read on its caller's thread (``ChatEngine.submit``)."""

    def __init__(
        self,
        process: LlamaServerProcess,
        *,
        model_name: str | None = None,
        sampling: SamplingDefaults | None = None,
        owns_process: bool = True,
        template: TemplateChoice | None = None,
        n_ctx: int | None = None,
        slots: int = 1,
        restarts: RestartPolicy = DEFAULT_RESTARTS,
        ready_timeout_s: float = 600.0,
        follow_load: FollowLoad | None = None,
        load_lookout: LoadLookout | None = None,
    ) -> None:
        self.slots = max(1, slots)
        """Requests llama-server decodes at once (its ``-np``, the plan's slots): ``serve`` lets that many
        through together; each runs on its own connection, so ``generate`` may be called from as many threads."""
        self.process = process
        self.supervisor: Supervisor | None = None
        """What watches, restarts and at the end stops the child (None: not this engine's to own)."""
        if owns_process:
            self.supervisor = Supervisor(process, policy=restarts, ready_timeout_s=ready_timeout_s).start()
        self._api_key = process.api_key
        self._sampling = sampling or SamplingDefaults()
        self._model_name = model_name
        self._n_ctx = n_ctx
        self._template = template
        self._opening: tuple[int, ...] | None = None
        self._ready_timeout_s = ready_timeout_s
        self._gate = RequestGate()
        self._follower: LoadFollower | None = None
        threads = threads_in(process.argv)
        if follow_load is not None and self.supervisor is not None and threads is not None:
            self._follower = LoadFollower(
                gate=self._gate,
                relaunch=self._relaunch,
                threads=threads,
                follow=follow_load,
                first_start_s=process.ready_after_s or 1.0,
                lookout=load_lookout or CpuLookout(lambda: process.pid),
            ).start()

    @property
    def base_url(self) -> str:
        """Where llama-server listens now (a restarted child may have had to take another port)."""
        return self.process.url

    def health(self) -> RunnerHealth:
        """Whether llama-server can answer: ``ready``, ``restarting`` (it stopped and is being started again),
        ``failed`` (it kept stopping, or it stopped with no supervisor to start it again) or ``stopped``; with the
        threads it runs with where it follows the load."""
        if self.supervisor is not None:
            health = self.supervisor.health
            return health if self._follower is None else replace(health, threads=self._follower.state())
        if self.process.pid is not None and not self.process.running:
            return RunnerHealth("failed", self.process.exit_summary())
        return RunnerHealth()

    @property
    def runner_pid(self) -> int | None:
        return self.process.pid

    def measure_verify_costs(self, n_max_batch: int) -> None:
        """None: llama-server verifies drafts in its child, by its own rule."""

    @property
    def model_name(self) -> str:
        if self._model_name is None:
            data = self._get("/v1/models")
            models = data.get("data") if isinstance(data, dict) else None
            self._model_name = str(models[0]["id"]) if models else "llama-server"
        return self._model_name

    @property
    def n_ctx(self) -> int:
        if self._n_ctx is None:
            props = self._get("/props")
            try:
                self._n_ctx = int(props["default_generation_settings"]["n_ctx"])
            except (KeyError, TypeError, ValueError):
                raise ServerError("llama-server's /props did not say its context size.") from None
        return self._n_ctx

    @property
    def template(self) -> TemplateChoice:
        """The chat template llama-server applies: as given, else the built-in its argv names
        (``--chat-template NAME``: the plan passes only names), else the Jinja source its ``/props`` has."""
        if self._template is None:
            named = dict(split_flags(self.process.argv)).get("--chat-template")
            if named:
                self._template = TemplateChoice("builtin", named)
            elif source := str(self._get("/props").get("chat_template") or ""):
                self._template = TemplateChoice("jinja", templates.TEMPLATE_GGUF, source)
            else:
                self._template = TemplateChoice("completion", templates.TEMPLATE_COMPLETION)
        return self._template

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (``templates.tool_format``, as the embedded engine decides it)."""
        return templates.tool_format(self.template)

    @functools.cached_property
    def turn_markers(self) -> tuple[str, ...]:
        """The control text llama-server's template writes (``templates.turn_markers`` of a rendered probe)."""
        if self.template.kind == "completion":
            return ()
        return templates.probe_turn_markers(self._applied_template, (RequestRefused, ServerError))

    def _opening_tokens(self) -> tuple[int, ...]:
        """The tokens of the template's turn-opening markers that are one token each (``/tokenize`` with
        special tokens read as such), asked once: barred under a grammar (``server_tools.completion_payload``)."""
        if self._opening is None:
            found: list[int] = []
            for marker in (m for m in self.turn_markers if toolcalls.opens_a_turn(m)):
                tokens, _status = self._tokenize(marker, parse_special=True)
                if tokens is not None and len(tokens) == 1 and isinstance(tokens[0], int):
                    found.append(tokens[0])
            self._opening = tuple(found)
        return self._opening

    def count_tokens(self, text: str) -> int:
        with self._gate.request():
            self._check_runner()
            generation = self.process.generation
            try:
                tokens, status = self._tokenize(text)
            except ServerError:
                self._raise_if_exited(generation, wait_s=2.0)
                raise
        if tokens is None:
            raise ServerError(f"llama-server could not count tokens (HTTP {status}).")
        return len(tokens)

    def _tokenize(self, text: str, *, parse_special: bool = False) -> tuple[list[Any] | None, int]:
        """``/tokenize`` of ``text`` (no BOS added): its tokens (None unless it answered them) and the status."""
        body = {"content": text, "add_special": False, **({"parse_special": True} if parse_special else {})}
        resp = http_client.request(self.base_url, "POST", "/tokenize", body, api_key=self._api_key)
        data = resp.json()
        tokens = data.get("tokens") if resp.status == 200 and isinstance(data, dict) else None
        return (tokens if isinstance(tokens, list) else None), resp.status

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str | None:
        """None: llama-server applies its template in the child (a prompt is counted message by message, with no
        round trip to render it)."""
        return None

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse now what ``generate`` would refuse in the schema or grammar it sends (a keyword no grammar
        enforces; a schema over clover-local's limits where its grammar is sent), so a streamed request gets a
        400 before any reply is sent."""
        if toolcalls.forced_tools(request):
            toolcalls.call_grammar(request, self.tool_format)
        if request.json_schema is not None:
            schema_fields(request.json_schema)

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        """Stream the reply; setting ``cancel`` closes the connection, which stops llama-server's slot. While the
        child is being started again with other threads (``load_follow``), the request waits, then goes on."""
        if (request.messages is None) == (request.prompt is None):
            raise ServerError("A request needs exactly one of messages and prompt.")
        with self._gate.request():
            self._check_runner()
            if clover_enforces(self.template, request):
                events = self._stream(*self._enforced_payload(request), cancel, native=False)
                if toolcalls.shown_tools(request):
                    events = toolcalls.split_events(events, self.tool_format, request.tools)
                yield from events
                return
            yield from self._stream(*self._payload(request), cancel, native=True)

    def _stream(
        self, path: str, payload: dict[str, Any], cancel: threading.Event | None, *, native: bool
    ) -> Iterator[GenerationEvent]:
        """One streamed request; ``native``: llama-server's chat route, whose tool calls it parses itself."""
        started = time.perf_counter()
        started_at = time.monotonic()
        first_token_at: float | None = None
        generation = self.process.generation
        try:
            events = http_client.stream(self.base_url, path, payload, api_key=self._api_key)
        except ServerError:
            self._raise_if_exited(generation)
            raise
        n_deltas = 0
        last: dict[str, Any] = {}
        finish: FinishReason = "stop"
        calls = ToolCallCollector()
        ended = False
        try:
            for event in self._watched(events, generation):
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
                calls.add(event)
                text, reason = _delta_of(event)
                if text:
                    if first_token_at is None:
                        first_token_at = time.perf_counter()
                    n_deltas += 1
                    yield TextDelta(text)
                if reason is not None:
                    finish, ended = reason, True
                if "timings" in event or "usage" in event:
                    last = {**last, **event}
                    ended = True
            else:
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                elif not ended:
                    self._raise_if_exited(generation)  # the stream closed without an end: did it die?
        finally:
            events.close()
        made = calls.calls() if native else []
        if finish == "length":
            made = withhold_unfinished(made)
        for index, call in enumerate(made):
            yield ToolCallMade(index, call)
        elapsed = time.perf_counter() - started
        stats = _stats(last, finish, n_deltas, elapsed, (first_token_at or time.perf_counter()) - started)
        if self._follower is not None:
            self._follower.reply_finished(started_at, stats.completion_tokens, stats.decode_tokens_per_s)
        yield Finished(stats)

    def _check_runner(self) -> None:
        """Raise :class:`RunnerUnavailable` unless llama-server can answer now."""
        health = self.health()
        if health.state == "ready":
            return
        if health.state == "restarting":
            raise RunnerUnavailable(
                f"The model's runner is starting again ({health.why}).",
                f"Retry in {health.retry_after_s or 1:.0f} s.",
                retry_after_s=health.retry_after_s or 1.0,
            )
        raise RunnerUnavailable(
            f"The model's runner is not running: {health.why}.",
            "Start clover-local again; `clover-local doctor` checks the runtime, and the log has its last lines.",
        )

    def _raise_if_exited(self, generation: int, wait_s: float = 5.0) -> None:
        """:class:`RunnerDied` when the llama-server child this request talked to (``generation``) has stopped,
        waiting up to ``wait_s`` for a broken connection's server to finish exiting."""
        process = self.process
        if process.generation != generation or process.wait_exit(wait_s) is not None:
            summary = process.exit_summary() if process.generation == generation else process.last_exit
            raise RunnerDied(
                f"{summary or 'llama-server stopped'} while answering this request"
                + ("; it is being started again: send it again." if self.supervisor is not None else "."),
                retry_after_s=(process.ready_after_s or 1.0) + 1.0,
            )

    def _watched(self, events: Iterable[dict[str, Any]], generation: int) -> Iterator[dict[str, Any]]:
        """The stream's events; a broken stream from a server that died says so (no log lines)."""
        try:
            yield from events
        except ServerError:
            self._raise_if_exited(generation)
            raise

    def _relaunch(self, threads: int) -> float:
        """Start the child again with ``threads`` (the follower calls this with no request in flight), keeping
        what each slot holds (saved to files and restored: a conversation is not read again); the seconds it
        took."""
        process = self.process
        started = time.monotonic()
        saved = save_slots(self.base_url, self._api_key, process.slot_save_dir, self.slots)
        try:
            process.relaunch(with_threads(process.argv, threads), self._ready_timeout_s)
            restore_slots(self.base_url, self._api_key, saved)
        finally:
            forget_slots(process.slot_save_dir, saved)
        return time.monotonic() - started

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
        if self.supervisor is not None:
            self.supervisor.close()
            self.process.stop()

    def _get(self, path: str) -> Any:
        resp = http_client.request(self.base_url, "GET", path, api_key=self._api_key)
        if resp.status != 200:
            raise ServerError(f"llama-server answered {resp.status} to GET {path}.")
        return resp.json()

    def _payload(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        s = self._sampling
        sampling: dict[str, Any] = {
            "temperature": s.temperature if request.temperature is None else request.temperature,
            "top_p": s.top_p if request.top_p is None else request.top_p,
            "top_k": s.top_k if request.top_k is None else request.top_k,
            "min_p": s.min_p if request.min_p is None else request.min_p,
            "repeat_penalty": s.repeat_penalty,
            "stream": True,
            "cache_prompt": request.cache_prompt,
            "timings_per_token": False,
        }
        if request.seed is not None:
            sampling["seed"] = request.seed
        stop = [*request.stop, *(self.turn_markers if request.messages is not None else ())]
        if stop:
            sampling["stop"] = stop
        if request.messages is not None:
            payload = {
                "model": self._model_name or "default",
                "messages": [openai_message(m) for m in request.messages],
                "max_tokens": request.max_tokens,
                "stream_options": {"include_usage": True},
                **sampling,
                **agent_payload(request),
            }
            return "/v1/chat/completions", payload
        prompt: dict[str, Any] = {"prompt": request.prompt, "n_predict": request.max_tokens, **sampling}
        if request.json_schema is not None:
            prompt.update(schema_fields(request.json_schema))
        return "/completion", prompt

    def _enforced_payload(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        """``/completion`` for clover-local's route: the prompt llama-server's template makes of the messages
        (tools folded in where it cannot show them), under the grammar the embedded engine would use."""
        messages = request.messages or ()
        tools = toolcalls.shown_tools(request)
        template = self.template
        if templates.renders_tools(template):
            prompt = self._applied_template(messages, tools=tools)
        else:
            messages = toolcalls.fallback_messages(messages, tools, request.tool_choice)
            if template.kind == "completion":
                prompt = templates.render_completion(messages)
            else:
                prompt = self._applied_template(messages)
        grammar = toolcalls.call_grammar(request, self.tool_format)
        _path, sampling = self._payload(replace(request, messages=None, prompt=prompt, json_schema=None))
        extra = completion_payload(request, prompt, grammar, self.turn_markers, self._opening_tokens())
        return "/completion", {**sampling, **extra}

    def _applied_template(self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()) -> str:
        """The prompt llama-server's chat template makes of ``messages`` (``/apply-template``)."""
        body: dict[str, Any] = {"messages": [openai_message(m) for m in messages]}
        if tools:
            body["tools"] = [t.as_openai() for t in tools]
        resp = http_client.request(self.base_url, "POST", "/apply-template", body, api_key=self._api_key)
        data = resp.json()
        if resp.status == 200 and isinstance(data, dict) and isinstance(data.get("prompt"), str):
            return str(data["prompt"])
        error = RequestRefused if 400 <= resp.status < 500 else ServerError
        raise error(f"llama-server could not apply its chat template (HTTP {resp.status}): {data}")


def _delta_of(event: dict[str, Any]) -> tuple[str, FinishReason | None]:
    """New text and finish reason of one streamed event, for chat chunks and ``/completion`` events."""
    choices = event.get("choices")
    if isinstance(choices, list):
        if not choices:
            return "", None
        choice = choices[0]
        delta = choice.get("delta") or {}
        reason = choice.get("finish_reason")
        finish: FinishReason = reason if reason in ("length", "tool_calls") else "stop"
        return str(delta.get("content") or ""), finish if reason else None
    text = str(event.get("content") or "")
    if event.get("stop"):
        return text, "length" if event.get("stop_type") == "limit" else "stop"
    return text, None


def _stats(
    last: dict[str, Any], finish: FinishReason, n_deltas: int, elapsed_s: float, ttft_s: float
) -> GenerationStats:
    t = last.get("timings") or {}
    usage = last.get("usage") or {}
    cached = int(t.get("cache_n", 0) or 0)
    processed = int(t.get("prompt_n", 0) or 0)
    prompt_tokens = int(usage.get("prompt_tokens") or last.get("tokens_evaluated") or processed + cached)
    completion = int(
        usage.get("completion_tokens") or last.get("tokens_predicted") or t.get("predicted_n") or 0
    )
    if not t and not completion:
        completion = n_deltas
    decode_tps = float(t.get("predicted_per_second") or 0.0)
    if not decode_tps and completion and elapsed_s > ttft_s:
        decode_tps = completion / (elapsed_s - ttft_s)
    drafted = int(t.get("draft_n", 0) or 0)
    accepted = int(t.get("draft_n_accepted", 0) or 0)
    return GenerationStats(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        cached_tokens=cached,
        ttft_s=ttft_s,
        prefill_tokens_per_s=float(t.get("prompt_per_second") or 0.0),
        decode_tokens_per_s=decode_tps,
        draft_acceptance=(accepted / drafted) if drafted else None,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        finish_reason=finish,
    )
