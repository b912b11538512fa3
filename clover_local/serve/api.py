"""An OpenAI-compatible HTTP server over any ``ChatEngine`` (the embedded one, or ``LlamaServerEngine``).

Routes: ``/v1/chat/completions`` (with tools and structured output), ``/v1/completions``, OpenAI's
``/v1/responses`` and Anthropic's ``/v1/messages`` (streamed as server-sent events or not), ``/v1/models``,
``/health``; ``/v1/embeddings`` answers a named 400. With an API key, every request without it gets 401.
As many generations run at once as the engine has slots (``plan.parallel``: the embedded engine decodes them in one
batch, llama-server in its own slots); later requests wait in arrival order, and past ``max_queue`` waiting ones a
request gets 503 with ``Retry-After``: one queue owns the slots (``serve.slots``). A client that disconnects cancels
its generation and frees its slot, and bad requests get OpenAI-shaped 400s: the server keeps serving either way.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from clover_local.engine.types import (
    END,
    ChatEngine,
    Finished,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallMade,
    prompt_tokens,
)
from clover_local.errors import CloverError
from clover_local.netaddr import is_loopback_host
from clover_local.serve import adapters
from clover_local.serve import request_guard as guard
from clover_local.serve import tools as agent
from clover_local.serve.api_errors import REQUEST_ERRORS, ApiError, api_error, error_body
from clover_local.serve.header_deadline import HEADER_TIMEOUT_S
from clover_local.serve.openai_schema import ParsedRequest
from clover_local.serve.request_fields import ignored_header
from clover_local.serve.slots import QUEUE_PER_SLOT, STARTED, Reply, SlotQueue, Ticket, retry_headers

log = logging.getLogger("clover_local.serve")


@dataclass(frozen=True)
class ApiConfig:
    model_id: str
    """The name clients pass as ``model`` (``/v1/models`` lists it)."""
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_body_bytes: int = guard.MAX_BODY_BYTES
    body_timeout_s: float = guard.BODY_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    """Longest a request's headers may take to arrive (``serve.header_deadline``): then 408 and closed."""
    allowed_hosts: frozenset[str] | None = frozenset()
    """``Host`` names accepted besides loopback ones (:func:`request_guard.hosts_allowed`); None: any."""
    max_request_s: float = 1800.0
    """Longest one generation may run; then it is stopped and answered with what it made."""
    max_queue: int | None = None
    """Requests that may wait for a slot; past it one gets 503 with ``Retry-After``. None:
    :data:`serve.slots.QUEUE_PER_SLOT` per slot."""

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.model_id, *self.aliases)

    @staticmethod
    def for_model(
        preset_name: str,
        model_path: str | None,
        api_key: str | None = None,
        *,
        also: Sequence[str] = (),
    ) -> ApiConfig:
        """Serve ``model_path`` under the preset's name, under ``also`` (the names the person gave the model: the
        preset asked for, the model as typed, ``ORG/REPO:QUANT``), and under the GGUF's file name with and without
        ``.gguf`` (what people copy from `ls` or from `/v1/models` of other servers). Every one is listed by
        ``/v1/models`` and accepted as a request's ``model``."""
        names: list[str] = list(also)
        if model_path:
            path = Path(model_path)
            names += [path.name, path.stem]
        aliases = tuple(n for n in dict.fromkeys(n.strip() for n in names) if n and n != preset_name)
        return ApiConfig(model_id=preset_name, aliases=aliases, api_key=api_key)


class OpenAIServer:
    """The routes and the queue that owns the engine's slots."""

    def __init__(self, engine: ChatEngine, config: ApiConfig) -> None:
        self.engine = engine
        self.config = config
        slots = engine.slots
        max_queue = config.max_queue if config.max_queue is not None else QUEUE_PER_SLOT * slots
        self.queue = SlotQueue(engine, slots, max_queue)
        self._created = int(time.time())

    def close(self) -> None:
        """Let the slot workers end (the server has stopped)."""
        self.queue.close()

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
        ]
        return Starlette(
            routes=routes,
            middleware=[
                Middleware(
                    guard.RequestGuard,
                    allowed=self.config.allowed_hosts,
                    api_key=self.config.api_key,
                    max_bytes=self.config.max_body_bytes,
                    timeout_s=self.config.body_timeout_s,
                )
            ],
            exception_handlers={HTTPException: _http_error},  # type: ignore[dict-item]
        )

    async def health(self, request: Request) -> Response:
        runner = self.engine.health()
        if (
            runner.state != "ready"
        ):  # restarting after a stop, or given up (a lost RPC worker, a model too big...)
            restarting = runner.state == "restarting"
            body = {
                "status": "loading" if restarting else "error",
                "model": self.config.model_id,
                "error": runner.why,
                "restarts": runner.restarts,
            }
            wait = {"Retry-After": str(max(1, math.ceil(runner.retry_after_s or 1)))} if restarting else {}
            return JSONResponse(body, status_code=503, headers=wait)
        queue = self.queue
        busy = queue.busy
        ok: dict[str, object] = {
            "status": "ok",
            "model": self.config.model_id,
            "busy": busy > 0,
            "slots": {"total": queue.slots, "busy": busy, "idle": queue.slots - busy},
            "queue": {"waiting": queue.waiting, "limit": queue.max_queue},
            "restarts": runner.restarts,
        }
        if runner.threads is not None:  # a llama-server child that follows the load
            t = runner.threads
            ok["threads"] = {
                "in_use": t.threads,
                "planned": t.planned,
                "relaunching": t.relaunching,
                "relaunches": t.relaunches,
                "others_busy_cores": round(t.others_busy, 2),
                "note": t.note,
            }
        return JSONResponse(ok)

    async def models(self, request: Request) -> Response:
        data = [
            {"id": name, "object": "model", "created": self._created, "owned_by": "clover-local"}
            for name in self.config.model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def chat(self, request: Request) -> Response:
        return await self._handle(request, adapters.CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._handle(request, adapters.COMPLETIONS)

    async def responses(self, request: Request) -> Response:
        return await self._handle(request, adapters.RESPONSES)

    async def messages(self, request: Request) -> Response:
        return await self._handle(request, adapters.MESSAGES)

    async def embeddings(self, request: Request) -> Response:
        message = (
            "Embeddings are not supported: clover-local serves a generative model, which has no embedding "
            "endpoint here. Use a dedicated embedding model."
        )
        return JSONResponse(error_body(message, code="embeddings_not_supported"), status_code=400)

    async def _handle(self, request: Request, api: adapters.Adapter) -> Response:
        """Every generating route: the body parsed by its API's adapter, the prompt fitted to the context, a slot
        (or a place in the queue), then the engine's events written as that API answers them."""

        def refuse(exc: ApiError) -> Response:
            return JSONResponse(api.error_body(exc), status_code=exc.status, headers=retry_headers(exc))

        try:
            parsed = await _parse_request(request, api.parse, self.config.model_names)
            gen_request = await asyncio.to_thread(self._fit_context, parsed)
            self.queue.check()
        except REQUEST_ERRORS as exc:
            return refuse(api_error(exc))
        if parsed.stream:
            return StreamingResponse(
                self._stream(api.writer(parsed), gen_request),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **ignored_header(parsed)},
            )
        try:
            text, calls, finished = await self._collect(request, gen_request)
        except REQUEST_ERRORS as exc:
            return refuse(api_error(exc))
        return JSONResponse(api.response(parsed, text, calls, finished.stats), headers=ignored_header(parsed))

    async def _stream(self, writer: adapters.EventWriter, request: GenerationRequest) -> AsyncIterator[str]:
        """The reply's server-sent events, one write per wake-up of the loop: every event the engine made since
        the last one (a verified draft gives several tokens at once; a busy loop finds several waiting) goes
        out in one chunk, rather than one trip through the response and the socket per token; a failure of the
        engine ends the stream with its error event. When the client disconnects, Starlette cancels this
        generator and ``_events`` takes the request out of the queue or cancels its generation."""
        start = "".join(writer.start())
        if start:
            yield start
        reply = Reply(asyncio.get_running_loop())
        ticket = Ticket(request, reply)
        try:
            async for batch in self._events(ticket, reply):
                chunk = "".join(line for event in batch for line in _event_lines(writer, event))
                if chunk:
                    yield chunk
        except REQUEST_ERRORS as exc:
            yield "".join(writer.error(api_error(exc).body()))

    def _fit_context(self, parsed: ParsedRequest) -> GenerationRequest:
        """Refuse a prompt the context cannot hold; cap max_tokens to what is left of it."""
        req = parsed.request
        if req.prompt is not None:
            n_prompt = self.engine.count_tokens(req.prompt)
        else:
            n_prompt = prompt_tokens(self.engine, req.messages or ())
            n_prompt += agent.tool_prompt_tokens(req, self.engine.count_tokens)
        n_ctx = self.engine.n_ctx
        room = n_ctx - n_prompt
        if room < 1:
            raise ApiError(
                400,
                f"This model's context holds {n_ctx} tokens, but the prompt has about {n_prompt}. "
                "Shorten the prompt, or serve with a larger context.",
                code="context_length_exceeded",
                param="messages" if req.messages is not None else "prompt",
            )
        fitted = replace(req, max_tokens=min(req.max_tokens, room))
        agent.check_forced_call_fits(
            fitted, self.engine.tool_format, self.engine.count_tokens, parsed.max_tokens_param
        )
        self.engine.check_request(fitted)  # a grammar or schema the engine cannot enforce: a 400 now
        return fitted

    async def _events(self, ticket: Ticket, reply: Reply) -> AsyncIterator[list[GenerationEvent]]:
        """Post ``ticket`` to the queue and yield its events, as many at a time as the engine made since the loop
        last looked. Leaving (the consumer stops, or its client hung up) gives up its place in the queue or
        cancels its generation."""
        self.queue.post(ticket)  # QueueFull: the queue filled since this request was checked
        deadline: asyncio.TimerHandle | None = None
        try:
            while True:
                batch: list[GenerationEvent] = []
                for item in await reply.take():
                    if item is STARTED:
                        # The per-request time limit, from when its slot starts it: a reply that runs too long
                        # is stopped like one whose client left.
                        deadline = reply.loop.call_later(self.config.max_request_s, ticket.cancel.set)
                    elif item is END or isinstance(item, BaseException):
                        if batch:
                            yield batch  # what came before the end or the failure is delivered first
                        if isinstance(item, BaseException):
                            raise item
                        return
                    else:
                        batch.append(item)
                if batch:
                    yield batch
        finally:
            if deadline is not None:
                deadline.cancel()
            self.queue.leave(ticket)  # no-op when finished; else stops the engine or frees its place

    async def _collect(
        self, http_request: Request, request: GenerationRequest
    ) -> tuple[str, list[ToolCall], Finished]:
        """Run one generation to its end: its text, its tool calls, its stats (the engine's errors propagate)."""
        reply = Reply(asyncio.get_running_loop())
        ticket = Ticket(request, reply)
        watcher = asyncio.create_task(_leave_on_disconnect(http_request, self.queue, ticket))
        parts: list[str] = []
        calls: list[ToolCall] = []
        finished: Finished | None = None
        try:
            async for batch in self._events(ticket, reply):
                for event in batch:
                    if isinstance(event, TextDelta):
                        parts.append(event.text)
                    elif isinstance(event, ToolCallMade):
                        calls.append(event.call)
                    elif isinstance(event, Finished):
                        finished = event
        finally:
            watcher.cancel()
        if finished is None:
            raise CloverError("The engine ended without a result.")
        return "".join(parts), calls, finished


def _event_lines(writer: adapters.EventWriter, event: GenerationEvent) -> list[str]:
    """The server-sent events of one engine event, in the writer's API."""
    if isinstance(event, TextDelta):
        return writer.text(event.text)
    if isinstance(event, ToolCallMade):
        return writer.call(event)
    if isinstance(event, Finished):
        return writer.done(event.stats)
    return []


async def _leave_on_disconnect(request: Request, queue: SlotQueue, ticket: Ticket) -> None:
    """A client that hung up leaves the queue (its place goes to the next) or stops its generation."""
    while not ticket.cancel.is_set():
        if await request.is_disconnected():
            queue.leave(ticket)
            return
        await asyncio.sleep(0.25)


async def _parse_request(
    request: Request, parse: Callable[[Any, tuple[str, ...]], ParsedRequest], names: tuple[str, ...]
) -> ParsedRequest:
    """The body decoded, checked and parsed by the route's ``parse``, in a worker thread: a 16 MiB body or a
    large schema costs seconds of Python (``jsonschema`` checks about a thousand subschemas a second), and on
    the event loop those seconds stopped every other request, ``/health`` included."""
    raw = await request.body()

    def work() -> ParsedRequest:
        body = guard.decode_json(raw)
        guard.refuse_unsupported(body)
        guard.check_schema_size(body)
        return parse(body, names)

    return await asyncio.to_thread(work)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = "not_found" if exc.status_code == 404 else None
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(error_body(message, code=code), status_code=exc.status_code)


def create_app(engine: ChatEngine, config: ApiConfig) -> Starlette:
    """The ASGI app serving ``engine`` under ``config``."""
    return OpenAIServer(engine, config).app()


def bind_warning(host: str, api_key: str | None) -> str | None:
    """The warning to print when the server is reachable from other machines with no key."""
    if is_loopback_host(host) or api_key:
        return None
    return (
        f"warning: serving on {host} without an API key: anyone who can reach this machine can use the model. "
        "Add --api-key or --api-key-file, or bind to 127.0.0.1."
    )
