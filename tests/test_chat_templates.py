"""Chat templates render as transformers' ``apply_chat_template`` renders them, byte for byte, on templates
written to use each feature real ones use; a template that cannot render is found when it is checked (as the
embedded engine does when a model opens), with the fix."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from clover_local.engine import jinja_env, templates, toolcalls
from clover_local.engine.types import ChatMessage
from clover_local.errors import EngineError

transformers_templates = pytest.importorskip("transformers.utils.chat_template_utils")

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NAMESPACE_MACRO = """{%- macro turn(role, text) -%}
<{{ role }}>{{ text | trim }}</{{ role }}>
{%- endmacro -%}
{%- set ns = namespace(system=none, count=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}{%- set ns.system = m.content -%}{%- else -%}{%- set ns.count = ns.count + 1 -%}{%- endif -%}
{%- endfor -%}
{{ bos_token }}{% if ns.system %}[SYS {{ ns.count }}] {{ ns.system }}
{% endif %}
{% for m in messages if m.role != 'system' %}
    {{ turn(m.role, m.content) }}
{% endfor %}
"""
LOOP_CONTROLS = """{% for m in messages %}
{% if m.role == 'system' %}{% continue %}{% endif %}
{% if m.content == 'STOP' %}{% break %}{% endif %}
<|{{ m.role }}|>{{ m.content }}
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"""
GENERATION = """{% for m in messages %}
{% if m.role == 'assistant' %}<a>{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}</a>
{% else %}<u>{{ m.content }}</u>
{% endif %}
{% endfor %}"""
TOJSON = """{{ tools | tojson }}
{{ tools | tojson(indent=2) }}
{{ tools | tojson(separators=(',', ':'), sort_keys=true) }}
{{ messages[0] | tojson(ensure_ascii=true) }}
{{ {'b': 1, 'a': [1, 2]} | tojson(indent=4, sort_keys=true) }}
{{ dict(x=1, y='é') | tojson }}"""
RAISE = """{% for m in messages %}{% if m.role not in ['user', 'assistant', 'system'] %}
{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}{{ m.role }}: {{ m.content }}
{% endfor %}"""
REVERSED = """{% for m in messages | reverse %}{{ loop.index }}/{{ loop.length }} {{ m.content }}
{% endfor %}{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}
{% set last_user = (messages | selectattr('role', 'equalto', 'user') | list)[-1] %}last={{ last_user.content }}"""
TOOLS_REASONING = """{%- if tools %}<tools>
{% for t in tools %}{{ t.function.name }}: {{ t.function.parameters | tojson }}
{% endfor %}</tools>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
<think>{{ m.reasoning_content if m.reasoning_content is defined else '' }}|{{ m.thinking | default('-') }}</think>
{%- if m.tool_calls is defined %}{% for c in m.tool_calls %}<call>{{ c.function.name }}({{ c.function.arguments | tojson }})</call>{% endfor %}{% endif -%}
{{ m.content | default('', true) }}
{% elif m.role == 'tool' %}<result id="{{ m.tool_call_id }}">{{ m.content }}</result>
{% else %}{{ m.role }}> {{ m.content }}
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}assistant> {% endif %}"""
WHITESPACE = """  {% if true %}
    indented {{ 'x' }}
  {% endif %}
{#- a comment -#}
{%- for m in messages %}
  {{ m.content }}
{% endfor %}
{{ '%04d' % 7 }} {{ 'a,b' .split(',') | join('+') }} {{ messages | length }} {{ strftime_now('%Y') | length }}"""

CORPUS = {
    "chatml": CHATML,
    "namespace_macro": NAMESPACE_MACRO,
    "loop_controls": LOOP_CONTROLS,
    "generation": GENERATION,
    "tojson": TOJSON,
    "raise_exception": RAISE,
    "reversed": REVERSED,
    "tools_reasoning": TOOLS_REASONING,
    "whitespace": WHITESPACE,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief. Ünïcode"},
    {"role": "user", "content": "  Weather in Oslo?  "},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the tool.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    {"role": "assistant", "content": "Sunny.", "thinking": "Easy."},
    {"role": "user", "content": "STOP"},
    {"role": "user", "content": "Thanks"},
]


def _reference(source: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    rendered, _ = transformers_templates.render_jinja_template(
        conversations=[messages], chat_template=source, add_generation_prompt=True, **kwargs
    )
    return str(rendered[0])


@pytest.mark.parametrize("name", sorted(CORPUS))
@pytest.mark.parametrize("with_tools", [False, True])
def test_rendering_matches_transformers_byte_for_byte(name: str, with_tools: bool) -> None:
    source = CORPUS[name]
    messages = MESSAGES if name != "raise_exception" else [m for m in MESSAGES if m["role"] != "tool"]
    tools = TOOLS if with_tools else None
    if name == "tojson" and not with_tools:
        tools = []
    ours = jinja_env.render(source, messages, tools=tools, bos_token="<s>", eos_token="</s>")
    assert ours == _reference(source, messages, tools=tools, bos_token="<s>", eos_token="</s>")


def test_raise_exception_refuses_as_transformers_does() -> None:
    bad = [{"role": "robot", "content": "x"}]
    with pytest.raises(jinja2.TemplateError, match="Unknown role: robot"):
        _reference(RAISE, bad)
    with pytest.raises(jinja_env.TemplateRefused, match="Unknown role: robot"):
        jinja_env.render(RAISE, bad)
    with pytest.raises(EngineError, match="refused these messages"):
        templates.render_jinja(RAISE, [ChatMessage("tool", "x")], bos_token="", eos_token="")


def test_break_continue_and_generation_chat_through_the_engine_renderer() -> None:
    msgs = [ChatMessage("system", "S"), ChatMessage("user", "hi"), ChatMessage("assistant", "yo")]
    for source in (LOOP_CONTROLS, GENERATION):
        text = templates.render_jinja(source, msgs, bos_token="<s>", eos_token="</s>")
        assert "hi" in text and text == _reference(
            source, [toolcalls.template_message(m) for m in msgs], bos_token="<s>", eos_token="</s>"
        )
        templates.check_template(
            lambda m, source=source: templates.render_jinja(source, m, bos_token="", eos_token="")
        )


def test_a_template_is_compiled_once() -> None:
    jinja_env.compile_template.cache_clear()
    for _ in range(3):
        jinja_env.render(CHATML, [{"role": "user", "content": "x"}])
    assert jinja_env.compile_template.cache_info().misses == 1


@pytest.mark.parametrize(
    "source",
    [
        "{% for m in messages %}{{ m.content }",
        "{{ messages[0].content.nope() }}",
        "{{ ''.__class__.__mro__ }}",
    ],
)
def test_a_template_that_cannot_render_is_found_when_checked_with_the_fix(source: str) -> None:
    def render(msgs: Any) -> str:
        return templates.render_jinja(source, msgs, bos_token="", eos_token="")

    with pytest.raises(EngineError) as info:
        templates.check_template(render)
    assert info.value.fix and "chat_template" in info.value.fix


def test_a_template_that_only_refuses_a_system_message_passes_the_check() -> None:
    source = (
        "{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    templates.check_template(lambda m: templates.render_jinja(source, m, bos_token="", eos_token=""))


def test_namespaces_refuse_underscore_names() -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        jinja_env.render("{% set ns = namespace(_x=1) %}{{ ns._x }}", [])


@pytest.mark.parametrize("name", ["loop_controls", "generation"])
def test_a_gguf_whose_template_uses_them_chats_on_the_embedded_engine(name: str) -> None:
    """The template inside a GGUF (a tiny random llama written with it) is what the engine opens with: rendered as
    transformers renders it, and a reply is generated from it."""
    from clover_local.engine.loader import load_engine
    from clover_local.engine.types import GenerationRequest
    from clover_local.plan.types import SpeculativePlan
    from clover_local.testing.gguf_writer import TinySpec
    from clover_local.testing.models import tiny_model_from_spec
    from clover_local.testing.settings import engine_settings
    from tests.helpers_engine import generate_text

    source = {"loop_controls": LOOP_CONTROLS, "generation": GENERATION}[name]
    path = tiny_model_from_spec(TinySpec(kind="llama", chat_template=source))
    plain = SpeculativePlan(enabled=False)
    engine = load_engine(path, engine_settings(path, ctx=512, speculative=plain), speculative=plain).engine
    try:
        msgs = [ChatMessage("system", "S"), ChatMessage("user", "hi"), ChatMessage("assistant", "yo")]
        msgs.append(ChatMessage("user", "and now?"))
        reference = [toolcalls.template_message(m) for m in msgs]
        # The tiny vocabulary spells its bos and eos <s> and </s>.
        assert engine.render_prompt(msgs) == _reference(source, reference, bos_token="<s>", eos_token="</s>")
        _text, stats = generate_text(
            engine, GenerationRequest(messages=tuple(msgs), max_tokens=4, temperature=0)
        )
        assert stats.prompt_tokens > 0 and stats.completion_tokens > 0
    finally:
        engine.close()


def test_a_gguf_whose_template_cannot_render_is_refused_when_it_opens() -> None:
    """Found at load (with the fix), not at the first request."""
    from clover_local.engine.loader import load_engine
    from clover_local.testing.gguf_writer import TinySpec
    from clover_local.testing.models import tiny_model_from_spec
    from clover_local.testing.settings import engine_settings

    path = tiny_model_from_spec(TinySpec(kind="llama", chat_template="{{ messages[0].content.nope() }}"))
    with pytest.raises(EngineError) as info:
        load_engine(path, engine_settings(path, ctx=512))
    assert info.value.fix and "chat_template" in info.value.fix
