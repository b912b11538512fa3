"""The Jinja environment chat templates are written for: the one transformers' ``apply_chat_template`` builds
(``transformers/utils/chat_template_utils.py``, ``_cached_compile_jinja_template``), so a GGUF's template gives
the prompt text its authors tested. Sandboxed (``ImmutableSandboxedEnvironment``), ``trim_blocks`` and
``lstrip_blocks``, loop controls (``{% break %}``, ``{% continue %}``), the ``{% generation %}`` tag,
``raise_exception``, ``strftime_now``, ``tojson`` with all of ``json.dumps``' arguments, ``dict`` and a
``namespace`` that refuses underscore names. Each template source is compiled once."""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning comes under; templates read the first (``thinking`` for gpt-oss)."""


class TemplateRefused(jinja2.exceptions.TemplateError):
    """The template called ``raise_exception``: it refuses these messages (not a broken template)."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's text for training masks; renders
    its body unchanged (transformers' ``AssistantTracker`` without a tracker active)."""

    tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares it so

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise TemplateRefused(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _TemplateDict:
    """``dict(...)`` for templates without the type itself (no attribute access into ``dict``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore-prefixed attributes (a way towards CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature: `self` may be a key
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, dict(*rest, **kwargs))

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled once (a syntax error raises ``jinja2.TemplateSyntaxError`` here)."""
    return _environment().from_string(source)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to a template: keys whose value is None dropped, and reasoning
    under each of its names (``reasoning_content`` and ``thinking``)."""
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render(
    source: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """``source`` rendered as ``apply_chat_template(messages, tools=..., tokenize=False, ...)`` renders it;
    jinja2's errors pass through (``TemplateRefused`` when the template refuses the messages)."""
    return compile_template(source).render(
        messages=template_messages(messages),
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
