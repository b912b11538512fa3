"""OpenAI request bodies in, ``GenerationRequest`` out (``openai_api`` writes the results in OpenAI's shapes).

Pure functions with no web framework in them, so the checks (a bad field names the field) are tested alone.
A problem with the request raises :class:`ApiError`, which the server turns into OpenAI's error JSON.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from clover_local.engine.types import ChatMessage, GenerationRequest, Role
from clover_local.serve import tools as agent
from clover_local.serve.api_errors import ApiError, json_object
from clover_local.serve.request_fields import check_fields, sampling
from clover_local.serve.request_guard import check_stops

ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


@dataclass(frozen=True)
class ParsedRequest:
    request: GenerationRequest
    model: str
    stream: bool
    include_usage: bool
    max_tokens_given: bool
    max_tokens_param: str = "max_tokens"
    """The field that set ``max_tokens`` in this API (``max_completion_tokens``, ``max_output_tokens``)."""
    ignored_fields: tuple[str, ...] = ()
    """Fields the request had that change nothing here (``request_fields.NO_OP``), named back to the client."""


def parse_chat(body: Any, known_models: tuple[str, ...]) -> ParsedRequest:
    """Validate a ``/v1/chat/completions`` body."""
    body = json_object(body)
    ignored = check_fields(body, "/v1/chat/completions")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages.", param="messages")
    messages = tuple(_message(m, i) for i, m in enumerate(raw_messages))
    agent.check_tool_results(messages)
    return parsed_request(body, known_models, ignored, messages=messages, **agent.agent_fields(body))


def parse_completion(body: Any, known_models: tuple[str, ...]) -> ParsedRequest:
    """Validate a ``/v1/completions`` body (one prompt string)."""
    body = json_object(body)
    ignored = check_fields(body, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string (one prompt per request).", param="prompt")
    if body.get("echo"):
        raise ApiError(400, "'echo' is not supported.", param="echo")
    if body.get("suffix"):
        raise ApiError(400, "'suffix' (fill-in-the-middle) is not supported.", param="suffix")
    return parsed_request(body, known_models, ignored, prompt=prompt)


def _message(raw: Any, index: int) -> ChatMessage:
    param = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise ApiError(400, f"{param} must be an object with 'role' and 'content'.", param=param)
    if raw.get("role") == "tool":
        return agent.parse_tool_message(raw, param)
    role = ROLES.get(str(raw.get("role")))
    if role is None:
        raise ApiError(
            400,
            f"{param}.role {raw.get('role')!r} is not supported; use system, user, assistant or tool.",
            param=f"{param}.role",
        )
    content = raw.get("content")
    if content is None and role == "assistant":
        content = ""
    content = agent.text_content(content, f"{param}.content")
    calls = (
        agent.parse_assistant_calls(raw.get("tool_calls"), f"{param}.tool_calls")
        if role == "assistant"
        else ()
    )
    return ChatMessage(role=role, content=content, tool_calls=calls)


def parsed_request(
    body: dict[str, Any],
    known_models: tuple[str, ...],
    ignored: tuple[str, ...],
    *,
    names: dict[str, str] | None = None,
    **route_fields: Any,
) -> ParsedRequest:
    """The request, from the fields every route shares, read (and named in errors) under the route's own
    ``names`` for them (Responses: ``max_output_tokens``; Messages: ``stop_sequences``), and ``route_fields``,
    the ``GenerationRequest`` fields the route read itself (messages or prompt, tools...). ``ignored``: the
    no-op fields the body had (``request_fields.check_fields``)."""
    names = dict(names or {})
    model = body.get("model")
    if model is None:
        model = known_models[0]
    if isinstance(model, str) and model not in known_models:  # file names are typed in any case
        model = next((m for m in known_models if m.lower() == model.lower()), model)
    if not isinstance(model, str) or model not in known_models:
        raise ApiError(
            400,
            f"The model {model!r} does not exist here; this server serves {', '.join(map(repr, known_models))}.",
            code="model_not_found",
            param="model",
        )
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "Only n=1 is supported.", param="n")
    if "max_completion_tokens" in body and "max_tokens" not in names:  # chat's only: other routes refused it
        names["max_tokens"] = "max_completion_tokens"
    stop_key = names.get("stop", "stop")
    stop = body.get(stop_key)
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise ApiError(400, f"'{stop_key}' must be a string or a list of strings.", param=stop_key)
    check_stops(stop or [], stop_key)
    checked = sampling(body, names)
    options = body.get("stream_options") or {}
    request = GenerationRequest(
        max_tokens=checked.max_tokens if checked.max_tokens is not None else 1 << 30,
        temperature=checked.temperature,
        top_p=checked.top_p,
        top_k=checked.top_k,
        min_p=checked.min_p,
        seed=checked.seed,
        stop=tuple(s for s in (stop or []) if s),
        cache_prompt=checked.cache_prompt,
        **route_fields,
    )
    return ParsedRequest(
        request,
        model,
        stream=checked.stream,
        include_usage=bool(options.get("include_usage")) if isinstance(options, dict) else False,
        max_tokens_given=checked.max_tokens is not None,
        max_tokens_param=names.get("max_tokens", "max_tokens"),
        ignored_fields=ignored,
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"
