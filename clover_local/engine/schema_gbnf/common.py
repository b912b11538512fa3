"""Helpers the schema walk and the shortest-value search share: literals, references, keyword readers."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from clover_local.engine.schema_gbnf.limits import SchemaRefused

INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')


def format_literal(text: str) -> str:
    return '"' + _LITERAL_ESCAPE_RE.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], text) + '"'


def constant(value: Any) -> str:
    return format_literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


class Document:
    """One schema document: the root its references resolve against. A reference is a JSON pointer (``#/a/b``,
    RFC 6901, percent-decoded as RFC 6901 section 6 says for a URI fragment), a plain name (``#num``: the
    subschema whose ``$id``/``id`` is ``#num`` or whose ``$anchor`` is ``num``), or either of them after the
    document's own ``$id``/``id`` (``https://example.com/s.json#/definitions/x``). Anything else points at
    another document, which is never fetched."""

    def __init__(self, root: Any, prefix: str) -> None:
        self.root = root
        self.prefix = prefix
        self._anchors: dict[str, tuple[Any, str]] | None = None
        base = root.get("$id", root.get("id")) if isinstance(root, dict) else None
        self.base = base.split("#", 1)[0] if isinstance(base, str) else ""

    def local(self, ref: str) -> str | None:
        """``ref`` as a fragment of this document (``#...``), or None when it points at another document."""
        if ref.startswith("#"):
            return ref
        if self.base and ref.split("#", 1)[0] == self.base:
            return "#" + ref.split("#", 1)[1] if "#" in ref else "#"
        return None

    def locate(self, ref: Any, path: str) -> tuple[Any, str]:
        """The subschema ``ref`` names and its JSON pointer in the document (``#/...``)."""
        if not isinstance(ref, str):
            raise SchemaRefused("$ref", path, "must be a string.")
        if (fragment := self.local(ref)) is None:
            raise SchemaRefused(
                "$ref", path, f"{ref!r} points outside the schema; remote references are never fetched."
            )
        fragment = unquote(fragment[1:])
        if fragment and not fragment.startswith("/"):
            if (found := self.anchors().get(fragment)) is None:
                raise SchemaRefused(
                    "$ref", path, f"cannot resolve {ref!r}: no subschema is named {fragment!r}."
                )
            return found
        target = self.root
        for token in fragment.split("/")[1:] if fragment else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise SchemaRefused("$ref", path, f"cannot resolve {ref!r}: {token!r} not found.")
        return target, "#" + fragment

    def anchors(self) -> dict[str, tuple[Any, str]]:
        """Plain names (``$anchor``, or an ``$id``/``id`` that is a fragment) of the document's subschemas."""
        if self._anchors is None:
            found: dict[str, tuple[Any, str]] = {}
            stack: list[tuple[Any, str]] = [(self.root, "#")]
            while stack:
                node, at = stack.pop()
                if isinstance(node, list):
                    stack += [(v, pointer(at, i)) for i, v in enumerate(node)]
                    continue
                if not isinstance(node, dict):
                    continue
                for key in ("$anchor", "$id", "id"):
                    name = node.get(key)
                    if isinstance(name, str) and (key == "$anchor" or name.startswith("#")):
                        found.setdefault(name.removeprefix("#"), (node, at))
                stack += [
                    (v, pointer(at, k))
                    for k, v in node.items()
                    if k not in ("const", "enum", "default", "examples")
                ]
            self._anchors = found
        return self._anchors


def existing(root: Any, path: str) -> str:
    """The longest start of ``path`` that is a place in ``root``: a keyword met in a part merged in (an
    ``allOf`` part, a referenced definition) is reported at the schema that brought it in."""
    node, out = root, "#"
    for token in path[2:].split("/") if path.startswith("#/") else []:
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            break
        out += "/" + token
    return out


def pointer(path: str, *tokens: str | int) -> str:
    """``path`` extended by ``tokens``, each escaped as RFC 6901 says (``/`` as ``~1``, ``~`` as ``~0``)."""
    return path + "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


def build_repetition(item: str, lo: int, hi: int | None, sep: str = "", limit: int | None = None) -> str:
    """llama.cpp's ``build_repetition`` (``hi`` None: no maximum), with each ``{m,n}`` at most ``limit``: a larger
    count is written as nested repetitions of blocks of ``limit`` (llama.cpp's grammar parser reads a maximum
    above 2,000 as no maximum at all)."""
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return f"{item}?"
    if not sep:
        if lo == 1 and hi is None:
            return f"{item}+"
        if lo == 0 and hi is None:
            return f"{item}*"
        if limit is not None and max(lo, hi or 0) > limit:
            return _nested(item, lo, hi, limit)
        return f"{item}{{{lo},{'' if hi is None else hi}}}"
    inner = build_repetition(f"({sep} {item})", max(lo - 1, 0), None if hi is None else hi - 1, limit=limit)
    result = item + " " + inner
    return f"({result})?" if lo == 0 else result


def _nested(item: str, lo: int, hi: int | None, limit: int) -> str:
    """``item{lo,hi}`` in repetitions of at most ``limit`` (exact: every count from ``lo`` to ``hi``)."""

    def exactly(x: str, n: int) -> str:
        if n <= limit:
            return f"{x}{{{n}}}" if n else ""
        q, r = divmod(n, limit)
        return f"{exactly(f'({x}{{{limit}}})', q)} {x}{{{r}}}".strip()

    def up_to(x: str, m: int) -> str:
        if m <= limit:
            return f"{x}{{0,{m}}}" if m else ""
        q, r = divmod(m, limit)
        block = f"({x}{{{limit}}})"
        return f"( {up_to(block, q - 1)} {x}{{0,{limit}}} | {exactly(block, q)} {x}{{0,{r}}} )"

    head = exactly(item, lo)
    tail = f"{item}*" if hi is None else up_to(item, hi - lo)
    return f"{head} {tail}".strip()


def repetition_cost(lo: int, hi: int | None, limit: int) -> int:
    """Grammar elements llama.cpp's parser writes out for ``build_repetition(.., lo, hi, limit=limit)``: each
    ``{m,n}`` is copied ``max(m, n)`` times."""
    cost = 0
    for count in (lo, (hi - lo) if hi is not None else 0):
        while count > limit:
            cost += 2 * limit
            count //= limit
        cost += count + 1
    return cost


def class_char(ch: str) -> str:
    return {"\\": "\\\\", "]": "\\]", "-": "\\-", "\n": "\\n", "\r": "\\r", '"': '\\"', "^": "\\^"}.get(
        ch, ch
    )


def schema_list(value: Any, key: str, path: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise SchemaRefused(key, path, "must be a non-empty array of schemas.")
    return value


def required_of(schema: dict[str, Any], path: str) -> set[str]:
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaRefused("required", path, "must be an array of property names.")
    return set(required)


def count_of(schema: dict[str, Any], key: str, path: str, default: int | None) -> Any:
    if key not in schema:
        return default
    value = schema[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaRefused(key, path, "must be a non-negative integer.")
    return value
