"""Whether a grammar's rule has a finite sentence: a schema whose every value would have to hold itself (a
required property that refers back to its own schema) makes a grammar no reply can ever end, and the reply
would be cut off at the token budget, which is no JSON at all."""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(
    r'\s*(?:(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])|(?P<name>[a-zA-Z0-9-]+)'
    r"|(?P<rep>\{\d*(?:,\d*)?\})|(?P<op>[()|*+?]))"
)
MAX_PASSES = 64
"""Passes over the rules; past this the rule is taken as finite (the check only ever refuses)."""


def endless(rules: dict[str, str]) -> set[str]:
    """The rules with no finite sentence (empty when every rule has one). Any such rule is refused, not just
    one the start needs: a reply that took an optional property down it could not end either."""
    trees = {name: _parse(body) for name, body in rules.items()}
    finite: set[str] = set()
    for _ in range(MAX_PASSES):
        grown = {name for name, tree in trees.items() if name not in finite and _ends(tree, finite)}
        if not grown:
            return set(trees) - finite
        finite |= grown
    return set()


def _parse(body: str) -> Any:
    tokens = [m for m in _TOKEN.finditer(body) if m.group(0).strip()]
    return _alternatives(tokens, 0)[0]


def _alternatives(tokens: list[re.Match[str]], i: int) -> tuple[Any, int]:
    options: list[list[Any]] = [[]]
    while i < len(tokens):
        m = tokens[i]
        if m["op"] == "|":
            options.append([])
        elif m["op"] == ")":
            break
        elif m["op"] == "(":
            inner, i = _alternatives(tokens, i + 1)
            options[-1].append(inner)
        elif m["op"] in ("*", "?") or (m["rep"] and m["rep"][1:].startswith(("0", ",", "}"))):
            if options[-1]:
                options[-1][-1] = ("optional",)
        elif m["name"]:
            options[-1].append(("ref", m["name"]))
        i += 1
    return ("alt", options), i


def _ends(tree: Any, finite: set[str]) -> bool:
    kind = tree[0]
    if kind == "ref":
        return tree[1] in finite
    if kind == "alt":
        return any(all(_ends(item, finite) for item in seq) for seq in tree[1])
    return True  # optional, or a literal or class (not kept in the tree)
