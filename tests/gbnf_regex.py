"""A non-recursive GBNF grammar as a Python regex, so tests can check exactly which texts a grammar accepts
(llama.cpp's own parser checks the syntax; this checks the language). Test helper only."""

from __future__ import annotations

import re

_TOKEN = re.compile(
    r'\s*(?:(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])|(?P<name>[a-zA-Z0-9-]+)'
    r"|(?P<rep>\{\d*(?:,\d*)?\})|(?P<op>[()|*+?]))"
)


def _unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[nxt]
            out.append(chr(int(body[i + 2 : i + 2 + n], 16)))
            i += 2 + n
        else:
            out.append({"n": "\n", "r": "\r", "t": "\t"}.get(nxt, nxt))
            i += 2
    return "".join(out)


def rules_of(grammar: str) -> dict[str, str]:
    rules = {}
    for line in grammar.splitlines():
        if "::=" in line:
            name, body = line.split("::=", 1)
            rules[name.strip()] = body.strip()
    return rules


def to_regex(grammar: str, start: str = "root") -> re.Pattern[str]:
    rules = rules_of(grammar)

    def rule(name: str, stack: tuple[str, ...]) -> str:
        if name in stack:
            raise ValueError(f"recursive rule {name}")
        body, out, pos = rules[name], [], 0
        while pos < len(body):
            m = _TOKEN.match(body, pos)
            if m is None:
                if body[pos:].strip():
                    raise ValueError(f"cannot read {body[pos:]!r}")
                break
            pos = m.end()
            if m["lit"]:
                out.append("(?:" + re.escape(_unescape(m["lit"][1:-1])) + ")")
            elif m["cls"]:
                out.append(m["cls"])
            elif m["name"]:
                out.append("(?:" + rule(m["name"], (*stack, name)) + ")")
            elif m["rep"]:
                out.append(m["rep"])
            else:
                out.append({"(": "(?:"}.get(m["op"], m["op"]))
        return "".join(out)

    return re.compile(rule(start, ()), re.DOTALL)
