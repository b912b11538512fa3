"""Random sentences of a GBNF grammar (recursive ones too), so a test can check that whatever a grammar lets
through is valid: each alternative, repetition count and character is drawn at random, and once a sentence
is long the shortest way out is taken, so every draw ends. Test helper only; llama.cpp's own parser checks
the syntax, this reads the language the same way ``tests/gbnf_regex.py`` does."""

from __future__ import annotations

import random
import re
import sys
from dataclasses import dataclass
from typing import Union

from tests.gbnf_regex import _TOKEN, _unescape, rules_of

Node = Union["Alt", "Seq", "Lit", "Cls", "Ref", "Rep"]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Cls:
    negated: bool
    ranges: tuple[tuple[int, int], ...]

    def allows(self, ch: str) -> bool:
        inside = any(lo <= ord(ch) <= hi for lo, hi in self.ranges)
        return inside != self.negated


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Rep:
    item: Node
    lo: int
    hi: int | None


_CLASS_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_POOL = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "é", "ß", "中", "€", "😀", "\x7f", "\x01"]
"""Characters a class is drawn from: printable ASCII, a few controls and a few non-ASCII ones."""


def _class(body: str) -> Cls:
    negated = body.startswith("^")
    if negated:
        body = body[1:]
    chars: list[tuple[str, bool]] = []  # (character, escaped)
    pos = 0
    while pos < len(body):
        m = _CLASS_ESCAPE.match(body, pos)
        if m:
            chars.append((_unescape(m.group(0)), True))
            pos = m.end()
        else:
            chars.append((body[pos], False))
            pos += 1
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == ("-", False):
            ranges.append((ord(chars[i][0]), ord(chars[i + 2][0])))
            i += 3
        else:
            ranges.append((ord(chars[i][0]), ord(chars[i][0])))
            i += 1
    return Cls(negated, tuple(ranges))


def parse(grammar: str) -> dict[str, Node]:
    """Each rule of ``grammar`` as a tree."""
    out: dict[str, Node] = {}
    for name, body in rules_of(grammar).items():
        tokens = []
        pos = 0
        while pos < len(body):
            m = _TOKEN.match(body, pos)
            if m is None:
                if body[pos:].strip():
                    raise ValueError(f"cannot read {body[pos:]!r}")
                break
            pos = m.end()
            tokens.append(m)
        node, rest = _alt(tokens, 0)
        if rest != len(tokens):
            raise ValueError(f"unbalanced rule {name}")
        out[name] = node
    return out


def _alt(tokens: list[re.Match[str]], i: int) -> tuple[Node, int]:
    options: list[Node] = []
    items: list[Node] = []
    while i < len(tokens):
        m = tokens[i]
        if m["op"] == "|":
            options.append(Seq(tuple(items)))
            items = []
            i += 1
        elif m["op"] == ")":
            break
        elif m["op"] == "(":
            inner, i = _alt(tokens, i + 1)
            items.append(inner)
            i += 1  # the ")"
        elif m["op"] in ("*", "+", "?"):
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[m["op"]]
            items[-1] = Rep(items[-1], lo, hi)
            i += 1
        elif m["rep"]:
            nums = m["rep"][1:-1].split(",")
            lo = int(nums[0] or 0)
            hi = lo if len(nums) == 1 else (int(nums[1]) if nums[1] else None)
            items[-1] = Rep(items[-1], lo, hi)
            i += 1
        elif m["lit"]:
            items.append(Lit(_unescape(m["lit"][1:-1])))
            i += 1
        elif m["cls"]:
            items.append(_class(m["cls"][1:-1]))
            i += 1
        else:
            items.append(Ref(m["name"]))
            i += 1
    options.append(Seq(tuple(items)))
    return (options[0] if len(options) == 1 else Alt(tuple(options))), i


class Endless(ValueError):
    """The grammar has no finite sentence."""


class Sampler:
    """Draws sentences of one grammar."""

    def __init__(self, grammar: str, seed: int = 0, soft_limit: int = 3000) -> None:
        self.rules = parse(grammar)
        self.rng = random.Random(seed)
        self.soft_limit = soft_limit
        self._short: dict[str, float] = {}
        self._shortest_lengths()
        self._lengths: dict[int, float] = {}
        self._pools: dict[int, list[str]] = {}

    def _shortest_lengths(self) -> None:
        """The shortest sentence of each rule (a fixpoint: recursive rules start at infinity)."""
        for name in self.rules:
            self._short[name] = float("inf")
        changed = True
        while changed:
            changed = False
            for name, node in self.rules.items():
                n = self.min_len(node)
                if n < self._short[name]:
                    self._short[name] = n
                    changed = True

    def _min_len(self, node: Node) -> float:
        """``min_len``, remembered once the rule lengths are settled."""
        key = id(node)
        if key not in self._lengths:
            self._lengths[key] = self.min_len(node)
        return self._lengths[key]

    def min_len(self, node: Node) -> float:
        if isinstance(node, Lit):
            return len(node.text)
        if isinstance(node, Cls):
            return 1
        if isinstance(node, Ref):
            return self._short[node.name]
        if isinstance(node, Seq):
            return sum(self.min_len(n) for n in node.items)
        if isinstance(node, Alt):
            return min(self.min_len(n) for n in node.options)
        return node.lo * self.min_len(node.item) if node.lo else 0

    def sentence(self, start: str = "root") -> str:
        """A random sentence; ``Endless`` when the rule has none of finite length."""
        if self._short[start] == float("inf"):
            raise Endless(f"{start} has no finite sentence: a reply under it could never end")
        out: list[str] = []
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20_000))
        try:
            self._emit(Ref(start), out, [0], 0)
        finally:
            sys.setrecursionlimit(limit)
        return "".join(out)

    def _emit(self, node: Node, out: list[str], size: list[int], depth: int) -> None:
        long = size[0] > self.soft_limit or depth > 30
        if isinstance(node, Lit):
            out.append(node.text)
            size[0] += len(node.text)
        elif isinstance(node, Cls):
            pool = self._pools.get(id(node))
            if pool is None:
                pool = [c for c in _POOL if node.allows(c)] or [chr(lo) for lo, _hi in node.ranges]
                self._pools[id(node)] = pool
            ch = self.rng.choice(pool)
            out.append(ch)
            size[0] += 1
        elif isinstance(node, Ref):
            self._emit(self.rules[node.name], out, size, depth + 1)
        elif isinstance(node, Seq):
            for item in node.items:
                self._emit(item, out, size, depth)
        elif isinstance(node, Alt):
            finite = [o for o in node.options if self._min_len(o) != float("inf")]
            choice = min(finite, key=self._min_len) if long else self.rng.choice(finite)
            self._emit(choice, out, size, depth)
        else:
            hi = node.hi if node.hi is not None else node.lo + 4
            count = node.lo if long else self.rng.choice([node.lo, hi, self.rng.randint(node.lo, hi)])
            for _ in range(count):
                self._emit(node.item, out, size, depth)
