"""One policy for the top-level fields of a request, on every route (``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/v1/messages``):

- a field the route honours is type- and range-checked under the route's own name for it
  (:class:`Sampling`, a pydantic v2 model; ``max_output_tokens: 0`` is reported as ``max_output_tokens``);
- a field clients send that changes nothing here (``user``, ``metadata``, a penalty of 0, ``logprobs: false``)
  is accepted, and named in the ``X-Clover-Ignored-Fields`` response header and the log;
- any other field is a 400 naming it, as OpenAI answers: "Unrecognized request argument supplied: temprature".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from clover_local.serve.api_errors import ApiError

log = logging.getLogger(__name__)

IGNORED_HEADER = "X-Clover-Ignored-Fields"

LLAMA_CPP_EXTENSIONS = frozenset({"top_k", "min_p", "cache_prompt"})
"""llama-server's sampling fields that clients send to OpenAI-shaped routes, honoured here."""

_CHAT = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
    "stream", "stream_options", "n", "tools", "tool_choice", "parallel_tool_calls", "response_format",
}  # fmt: skip
_COMPLETION = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "n", "echo"}
_COMPLETION |= {"suffix", "stream_options"}
_RESPONSES = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "stream", "store", "seed", "truncation", "service_tier",
    "stream_options",
}  # fmt: skip
_MESSAGES = {"model", "messages", "system", "max_tokens", "tools", "tool_choice", "stop_sequences"}
_MESSAGES |= {"temperature", "top_p", "top_k", "stream"}

KNOWN: dict[str, frozenset[str]] = {
    "/v1/chat/completions": frozenset(_CHAT | LLAMA_CPP_EXTENSIONS),
    "/v1/completions": frozenset(_COMPLETION | LLAMA_CPP_EXTENSIONS),
    "/v1/responses": frozenset(_RESPONSES | LLAMA_CPP_EXTENSIONS),
    "/v1/messages": frozenset(_MESSAGES | LLAMA_CPP_EXTENSIONS),
}
"""The fields each route honours (checked where it reads them)."""

NO_OP = frozenset({"user", "metadata", "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs"})
NO_OP |= {"logit_bias", "repeat_penalty"}
"""Fields that change nothing here, accepted on every route and named back as ignored: labels (``user``,
``metadata``), and fields at the values that mean "not used" (``request_guard.UNSUPPORTED_FIELDS`` refuses any
other value by name, before the route reads the body)."""


def check_fields(body: Mapping[str, Any], route: str) -> tuple[str, ...]:
    """The no-op fields ``body`` has (to name in the response); a 400 for the first field the route neither
    honours nor can ignore."""
    for key in body:
        if key not in KNOWN[route] and key not in NO_OP:
            raise ApiError(
                400, f"Unrecognized request argument supplied: {key}", param=key, code="unrecognized_argument"
            )
    ignored = tuple(key for key in body if key in NO_OP)
    if ignored:
        log.info("%s: ignored fields that change nothing here: %s", route, ", ".join(ignored))
    return ignored


def ignored_header(parsed: Any) -> dict[str, str]:
    """The response header naming a request's no-op fields (``{}`` when it had none)."""
    fields: tuple[str, ...] = getattr(parsed, "ignored_fields", ())
    return {IGNORED_HEADER: ", ".join(fields)} if fields else {}


class Sampling(BaseModel):
    """The sampling fields every route shares, type- and range-checked (no coercion: ``"0.5"`` is refused; strict
    floats take integers, as JSON writes ``1`` for ``1.0``)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: StrictInt | None = None
    cache_prompt: StrictBool = True
    stream: StrictBool = False


def sampling(body: Mapping[str, Any], names: Mapping[str, str] | None = None) -> Sampling:
    """``body``'s sampling fields, read under the route's own ``names`` (``{"max_tokens": "max_output_tokens"}``);
    a bad value is a 400 naming the field as the client spelled it."""
    names = dict(names or {})
    raw = {f: body[names.get(f, f)] for f in Sampling.model_fields if body.get(names.get(f, f)) is not None}
    try:
        return Sampling.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        param = names.get(field, field)
        raise ApiError(400, f"'{param}': {first['msg']}.", param=param) from None
