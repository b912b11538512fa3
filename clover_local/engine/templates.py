"""Turning chat messages into prompt text: the GGUF's own Jinja template (sandboxed), a llama.cpp built-in
template, or plain completion text.

GGUF templates come from the internet; they are rendered in the sandboxed environment transformers'
``apply_chat_template`` builds (:mod:`clover_local.engine.jinja_env`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from clover_local.engine import toolcalls
from clover_local.engine.types import ChatMessage, ToolFormat, ToolSpec
from clover_local.errors import ChatTemplateRefused, EngineError

TEMPLATE_GGUF = "gguf"
TEMPLATE_COMPLETION = "completion"


@dataclass(frozen=True)
class TemplateChoice:
    """The template actually used, and a note for the person when it differs from what was asked."""

    kind: str
    """``jinja``, ``builtin`` or ``completion``."""
    name: str
    """Built-in name, ``gguf`` or ``completion``."""
    source: str | None = None
    """Jinja source for ``jinja``."""
    notice: str | None = None


def choose_template(
    requested: str, gguf_template: str | None, builtin_names: Sequence[str]
) -> TemplateChoice:
    """Resolve the preset's ``chat_template`` against what the GGUF holds and llama.cpp knows."""
    if requested == TEMPLATE_COMPLETION:
        return TemplateChoice("completion", TEMPLATE_COMPLETION)
    if requested == TEMPLATE_GGUF:
        if gguf_template:
            return TemplateChoice("jinja", TEMPLATE_GGUF, gguf_template)
        return TemplateChoice(
            "completion",
            TEMPLATE_COMPLETION,
            notice="This GGUF has no chat template; messages are sent as plain completion text. "
            "Set chat_template to a llama.cpp built-in name (e.g. 'chatml', 'gemma') in the preset for chat.",
        )
    if requested not in builtin_names:
        raise EngineError(
            f"Unknown chat template {requested!r}.",
            f"Use 'gguf', 'completion' or one of llama.cpp's built-ins: {', '.join(builtin_names)}.",
        )
    return TemplateChoice("builtin", requested)


def renders_tools(choice: TemplateChoice) -> bool:
    """The template itself shows ``tools``, earlier calls and their results (a Jinja template that mentions
    them). Otherwise clover-local's generic format is used, on both engines: the tools are listed in a system
    note, calls are written and forced in the Hermes format, and earlier calls and results are folded into text
    (:func:`clover_local.engine.toolcalls.fallback_messages`)."""
    return choice.kind == "jinja" and "tools" in (choice.source or "")


def tool_format(choice: TemplateChoice) -> ToolFormat:
    """How replies under this template write tool calls: the template's own format when it shows tools, else
    the generic format's Hermes JSON."""
    return toolcalls.detect_format(choice.source) if renders_tools(choice) else "hermes"


def tool_support(choice: TemplateChoice) -> str:
    """In words, for ``doctor``: whether this template calls tools natively, and what is used when it cannot."""
    if renders_tools(choice):
        return f"native: the chat template shows tools; calls in its {tool_format(choice)} format"
    return (
        "generic (the chat template has no tool syntax): tools listed in a system note, calls as Hermes "
        '<tool_call> JSON, forced by grammar for a required or named tool_choice (docs/agents-tools.md: "The generic tool format")'
    )


TURN_MARKERS = (
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<|endoftext|>",
    "[INST]",
    "[/INST]",
)
"""Text that opens or closes a turn in the chat formats llama.cpp knows (ChatML, Gemma, Llama 3, Phi, Zephyr,
Mistral). The ones a template writes are its control text: a reply never shows them."""
PROBE_MESSAGES = (
    ChatMessage("system", "S"),
    ChatMessage("user", "U"),
    ChatMessage("assistant", "A"),
    ChatMessage("user", "V"),
)
"""A short conversation rendered once per engine to find which turn markers its template writes."""


def turn_markers(rendered_probe: str) -> tuple[str, ...]:
    """The turn markers (:data:`TURN_MARKERS`) the template wrote when rendering :data:`PROBE_MESSAGES`. A chat
    reply stops where the model writes one of them, whether the model's vocabulary has it as one token (then
    it also ends generation as a token) or spells it out in pieces (a template the model was not trained on)."""
    return tuple(m for m in TURN_MARKERS if m in rendered_probe)


def probe_turn_markers(
    render: Callable[[Sequence[ChatMessage]], str], refused: tuple[type[Exception], ...]
) -> tuple[str, ...]:
    """:func:`turn_markers` of ``render`` (an engine's template) on :data:`PROBE_MESSAGES`, or on them without
    the system message when the template refuses one (``refused``: the errors that say so); () when it
    renders neither."""
    for probe in (PROBE_MESSAGES, PROBE_MESSAGES[1:]):
        try:
            return turn_markers(render(probe))
        except refused:
            continue
    return ()


def builtin_template_names() -> list[str]:
    """Names of the templates compiled into llama.cpp (``llama_chat_builtin_templates``)."""
    from llama_cpp import llama_cpp as C

    n = C.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    C.llama_chat_builtin_templates(arr, n)
    return [a.decode() for a in arr if a]


def render_jinja(
    source: str,
    messages: Sequence[ChatMessage],
    *,
    bos_token: str,
    eos_token: str,
    tools: Sequence[ToolSpec] = (),
) -> str:
    """Render a Hugging Face style chat template as transformers' ``apply_chat_template`` does
    (:mod:`clover_local.engine.jinja_env`: sandboxed, compiled once), with ``tools`` when there are some."""
    import jinja2

    from clover_local.engine import jinja_env

    try:
        return jinja_env.render(
            source,
            [toolcalls.template_message(m) for m in messages],
            tools=[t.as_openai() for t in tools] or None,
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja_env.TemplateRefused as exc:
        raise ChatTemplateRefused(f"The model's chat template refused these messages: {exc}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise EngineError(
            f"The model's chat template tried something unsafe and was stopped: {exc}"
        ) from None
    except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise EngineError(f"The model's chat template could not be rendered: {exc}", TEMPLATE_FIX) from None


TEMPLATE_FIX = "Set chat_template to a llama.cpp built-in name (e.g. 'chatml') or 'completion' in the preset."


def check_template(render: Callable[[Sequence[ChatMessage]], str]) -> None:
    """Render the probe conversation once when a model opens, so a template that cannot render is found
    then (with the fix), not at the first request; a template that only refuses a system message passes."""
    try:
        render(PROBE_MESSAGES)
    except EngineError as first:
        try:
            render(PROBE_MESSAGES[1:])
        except EngineError:
            if isinstance(first, ChatTemplateRefused):
                return
            raise EngineError(first.what, first.fix or TEMPLATE_FIX) from None


def render_builtin(name: str, messages: Sequence[ChatMessage]) -> str:
    """Render through llama.cpp's own ``llama_chat_apply_template``."""
    from llama_cpp import llama_cpp as C

    keep: list[bytes] = []
    chat = (C.llama_chat_message * len(messages))()
    for i, m in enumerate(messages):
        role, content = m.role.encode(), m.content.encode()
        keep += [role, content]
        chat[i].role, chat[i].content = role, content
    size = 4096 + 2 * sum(len(m.content.encode()) for m in messages)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = C.llama_chat_apply_template(name.encode(), chat, len(messages), True, buf, size)
        if n < 0:
            raise EngineError(f"llama.cpp could not apply the built-in chat template {name!r}.")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1
    raise EngineError(f"llama.cpp's template {name!r} kept growing its output.")


def render_completion(messages: Sequence[ChatMessage]) -> str:
    """Plain text: the messages' contents, one paragraph each (for base models)."""
    return "\n\n".join(m.content for m in messages)


Renderer = Callable[..., str]
"""``render(messages, tools=(), choice="auto")`` -> prompt text."""


def renderer(choice: TemplateChoice, *, bos_token: str, eos_token: str) -> Renderer:
    """A function (messages, tools=(), tool_choice="auto") -> prompt text for the chosen template. Tools,
    earlier calls and their results go through the template when it shows them, else are written into the
    messages in the generic format (:func:`~clover_local.engine.toolcalls.fallback_messages`)."""
    native_tools = renders_tools(choice)

    def render(msgs: Sequence[ChatMessage], tools: Sequence[ToolSpec] = (), tool_choice: str = "auto") -> str:
        if not native_tools:
            msgs, tools = toolcalls.fallback_messages(msgs, tools, tool_choice), ()
        if choice.kind == "jinja":
            return render_jinja(
                choice.source or "", msgs, bos_token=bos_token, eos_token=eos_token, tools=tools
            )
        if choice.kind == "builtin":
            return render_builtin(choice.name, msgs)
        return render_completion(msgs)

    return render


def gguf_chat_template(model: Any) -> str | None:
    """The GGUF's default chat template (``tokenizer.chat_template``), if any."""
    from llama_cpp import llama_cpp as C

    raw = C.llama_model_chat_template(model, None)
    return raw.decode("utf-8", errors="replace") if raw else None
