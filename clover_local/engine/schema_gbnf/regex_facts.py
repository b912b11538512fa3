"""What Python's own regex parser tells about a JSON Schema ``pattern``: its top-level alternatives, its
shortest and longest match, the characters a match begins with, and a version of it whose matches fit a length
(a subset). The schema converter uses these to hold lengths beside a pattern and to keep ``oneOf`` alternatives
apart; the grammar itself is written by :mod:`.pattern`."""

from __future__ import annotations

import re
import re._parser as _re_parser  # type: ignore[import-not-found]  # Python's own regex parser
from typing import Any


class Unsupported(ValueError):
    """The pattern is valid but has no grammar equivalent here (or is not a valid pattern). ``keyword``: the
    schema keyword beside the pattern that cannot be met with it (``minLength``, ``maxLength``), None when the
    pattern itself is the trouble; the message says why."""

    def __init__(self, why: str, *, keyword: str | None = None) -> None:
        super().__init__(why)
        self.keyword = keyword


def top_level_alternatives(pattern: str) -> list[str]:
    """``pattern`` split at each ``|`` outside groups and classes."""
    out, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*out, pattern[start:]]


def anchored(pattern: str) -> str:
    """``pattern`` as a match of the whole string (JSON Schema patterns search): each top-level alternative
    padded with ``.*`` on a side it does not anchor."""
    out = []
    for alternative in top_level_alternatives(pattern):
        if not alternative.startswith("^"):
            alternative = "^.*" + alternative
        if not alternative.endswith("$") or alternative.endswith("\\$"):
            alternative += ".*$"
        out.append(alternative)
    return "|".join(out)


def capped(pattern: str, cap: int) -> str:
    """``pattern`` with each repetition (``*``, ``+``, ``{m,}``, ``{m,n}``) at most ``cap`` (or its minimum):
    a subset."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            in_class = True
            out.append(c)
        elif c in "*+" and i > 0 and pattern[i - 1] not in "(|":
            out.append(f"{{{0 if c == '*' else 1},{max(cap, 1)}}}")
        elif c == "{" and (m := re.match(r"\{(\d+),(\d*)\}", pattern[i:])):
            low, high = int(m.group(1)), int(m.group(2)) if m.group(2) else None
            top = max(low, cap) if high is None else max(low, min(high, cap))
            out.append(f"{{{low},{top}}}")
            i += m.end()
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


_ONE_REPEATED = re.compile(r"\^(\[(?:\\.|[^\]\\])*\]|\\.|[^\\()|*+?{}\[\]^$])([*+]|\{(\d+)(,(\d*))?\})\$")


def within_lengths(pattern: str, lo: int, hi: int | None) -> str:
    """An anchored pattern whose matches are matches of ``pattern`` (anchored) no shorter than ``lo`` and no
    longer than ``hi``: one repeated character class takes the bounds as its count, any other pattern has its
    unbounded repetitions capped so its longest match fits. Raises ``Unsupported`` (with the bound that
    cannot be met) when there is none."""
    if single := _ONE_REPEATED.fullmatch(pattern):
        item, quantifier = single.group(1), single.group(2)
        if quantifier in "*+":
            m, n = (0 if quantifier == "*" else 1), None
        else:
            m = int(single.group(3))
            n = m if single.group(4) is None else (int(single.group(5)) if single.group(5) else None)
        first, last = max(lo, m), (hi if n is None else n if hi is None else min(hi, n))
        if last is not None and first > last:
            raise Unsupported("no match of the pattern is that short", keyword="maxLength")
        return f"^{item}{{{first},{'' if last is None else last}}}$"
    source = anchored(pattern)
    if hi is not None:
        if width(capped(source, 0))[1] > hi:
            raise Unsupported("the pattern's shortest way through is longer", keyword="maxLength")
        low, high = 0, max(hi, 1)
        while low < high:  # the largest cap whose longest match fits
            mid = (low + high + 1) // 2
            if width(capped(source, mid))[1] <= hi:
                low = mid
            else:
                high = mid - 1
        source = capped(source, low)
    if width(source)[0] < lo:
        raise Unsupported("the pattern matches shorter strings", keyword="minLength")
    return source


def width(pattern: str) -> tuple[int, int]:
    """The shortest and longest string ``pattern`` (anchored) matches, as Python's regex parser counts them."""
    try:
        lo, hi = _re_parser.parse(pattern).getwidth()
    except (re.error, OverflowError, RecursionError) as exc:
        raise Unsupported(f"Python's regex parser cannot read it ({exc})") from None
    return int(lo), int(hi)


DIGITS = "0123456789"
WORD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + DIGITS + "_"
"""The characters of ``\\d`` and ``\\w`` (ASCII, as JSON Schema's patterns read them)."""
_CATEGORY_CHARS = {"CATEGORY_DIGIT": DIGITS, "CATEGORY_WORD": WORD, "CATEGORY_SPACE": " \t\n\r\f\v"}


def first_chars(pattern: str) -> frozenset[int] | None:
    """The characters every match of an anchored ``pattern`` can begin with; None when that is not known
    here (unanchored, could be empty, a negated class or ``.``)."""
    if not pattern.startswith("^"):
        return None
    try:
        tree = list(_re_parser.parse(pattern))
    except (re.error, RecursionError):
        return None
    found = _firsts(tree[1:] if tree and str(tree[0][0]) == "AT" else tree)
    return None if found is None or found[1] else frozenset(found[0])


def _firsts(seq: list[Any]) -> tuple[set[int], bool] | None:
    """(first characters, whether ``seq`` can match the empty string)."""
    acc: set[int] = set()
    for op, av in seq:
        if (found := _first(str(op), av)) is None:
            return None
        acc |= found[0]
        if not found[1]:
            return acc, False
    return acc, True


def _first(op: str, av: Any) -> tuple[set[int], bool] | None:
    if op == "LITERAL":
        return {av}, False
    if op == "IN":
        chars: set[int] = set()
        for kind, value in av:
            kind = str(kind)
            if kind == "LITERAL":
                chars.add(value)
            elif kind == "RANGE" and value[1] - value[0] < 1000:
                chars |= set(range(value[0], value[1] + 1))
            elif kind == "CATEGORY" and str(value) in _CATEGORY_CHARS:
                chars |= {ord(c) for c in _CATEGORY_CHARS[str(value)]}
            else:
                return None
        return chars, False
    if op == "SUBPATTERN":
        return _firsts(list(av[-1]))
    if op == "BRANCH":
        out: set[int] = set()
        empty = False
        for branch in av[1]:
            if (found := _firsts(list(branch))) is None:
                return None
            out |= found[0]
            empty = empty or found[1]
        return out, empty
    if op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        found = _firsts(list(av[2]))
        return None if found is None else (found[0], av[0] == 0 or found[1])
    if op == "AT":
        return set(), True
    return None
