"""A small SentencePiece-style (``llama``) vocabulary for the tiny random test models.

llama.cpp's SPM tokenizer merges adjacent pieces whenever the joined text is in the vocabulary, and falls
back to the 256 byte tokens ``<0x00>``..``<0xFF>`` for anything left over, so every text tokenizes and
detokenizes back to itself. The word pieces (with every prefix, so merges can reach them) come from a
short built-in sample of English and Python: enough that common text takes few tokens.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# llama.cpp token types (llama_token_type / gguf.TokenType).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_BYTE = 6

SPACE = "\u2581"  # SentencePiece's visible space

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""A ChatML chat template (Qwen's format), stored in the tiny models for Jinja rendering tests."""

QWEN3_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}"
    "{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen3's tool-calling chat template (Hermes ``<tool_call>`` JSON), cut to what tools need: for tiny models
that test tool calls through a real template, in both engines."""

_SAMPLE_TEXT = """
The capital of France is Paris. The quick brown fox jumps over the lazy dog. A model reads the text and
writes the answer token by token. Please rename the function and return the whole file. Here is a summary
of the story: the user asked a question, and the assistant gave a short answer with an example.
What is the best way to run a large language model on a small machine? Use a quantized file, keep the
experts in memory, and let the graphics card hold the attention layers. This is a test of the system.
def main(argv: list[str]) -> int:
    for item in items:
        if item is None:
            return 0
        print(item, value, name, self.count)
    return len(result)
class Model:
    def __init__(self, path, context=4096):
        self.path = path
        self.context = context
import os
import sys
from pathlib import Path
while True: break
x = [1, 2, 3]; y = {"key": "value", "name": None}; z = (a + b) * c - d / e
"""


@dataclass(frozen=True)
class Vocab:
    """Token texts, scores and types in id order, plus the ids of the special tokens."""

    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    bos_id: int
    eos_id: int
    unk_id: int
    mask_id: int | None = None
    """The diffusion mask token (``<|mask|>``, last id), only in the vocabularies of diffusion models."""
    tool_call_id: int | None = None
    tool_call_end_id: int | None = None
    """Qwen's ``<tool_call>`` and ``</tool_call>`` (user-defined tokens, as in Qwen's vocabulary), only with
    ``tool_tokens``."""

    def __len__(self) -> int:
        return len(self.tokens)


def build_vocab(n_word_pieces: int, with_mask: bool = False, tool_tokens: bool = False) -> Vocab:
    """A deterministic SPM vocabulary: 3 specials, 2 ChatML controls, 256 bytes, then word pieces; with
    ``with_mask`` a last control token ``<|mask|>`` for diffusion models; with ``tool_tokens`` Qwen's
    ``<tool_call>`` and ``</tool_call>`` at the end."""
    tokens: list[str] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types: list[int] = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_CONTROL]
    scores: list[float] = [0.0] * len(tokens)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(TOKEN_BYTE)
        scores.append(0.0)
    seen = set(tokens)
    for piece in _word_pieces(n_word_pieces):
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(TOKEN_NORMAL)
            # Longer pieces win merges, so whole words come out as one token.
            scores.append(float(len(piece)))
    mask_id = None
    if with_mask:
        mask_id = len(tokens)
        tokens.append("<|mask|>")
        types.append(TOKEN_CONTROL)
        scores.append(0.0)
    tool_ids: list[int | None] = [None, None]
    if tool_tokens:
        for k, text in enumerate(("<tool_call>", "</tool_call>")):
            tool_ids[k] = len(tokens)
            tokens.append(text)
            types.append(TOKEN_USER_DEFINED)
            scores.append(0.0)
    return Vocab(
        tokens=tuple(tokens),
        scores=tuple(scores),
        types=tuple(types),
        bos_id=1,
        eos_id=2,
        unk_id=0,
        mask_id=mask_id,
        tool_call_id=tool_ids[0],
        tool_call_end_id=tool_ids[1],
    )


def _word_pieces(limit: int) -> list[str]:
    """Printable ASCII characters, then the most frequent words of the sample with all their prefixes."""
    pieces: list[str] = [SPACE]
    pieces += [chr(c) for c in range(33, 127)]
    pieces += [SPACE + chr(c) for c in range(33, 127)]
    words = Counter(re.findall(r" ?[A-Za-z_]+| ?[0-9]|[^\sA-Za-z0-9_]+", _SAMPLE_TEXT))
    for word, _count in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])):
        text = word.replace(" ", SPACE)
        for end in range(2, len(text) + 1):
            pieces.append(text[:end])
        if len(pieces) >= limit:
            break
    # Indentation runs, as in code.
    pieces += [SPACE * n for n in (2, 3, 4, 8)]
    return pieces[:limit]
