"""A JSON schema string ``pattern`` as GBNF: a port of ``_pattern_to_rule`` in llama.cpp's
``common/json-schema-to-grammar.cpp``, changed so that every sentence is a valid JSON string matching the
pattern: ``"``, ``\\`` and control characters a class or literal allows are written as their JSON escapes
(negated classes and ``.`` leave them out), ``\\d``/``\\w``/``\\s`` are classes, an escaped character takes its
own quantifier, an unanchored side is padded with ``.*`` (JSON Schema patterns search), and top-level
alternatives with anchors of their own are anchored each. A pattern the grammar cannot express is refused
(``Unsupported``), never widened to any string."""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby

from clover_local.engine.schema_gbnf.regex_facts import DIGITS, WORD, Unsupported, top_level_alternatives

MAX_PATTERN_DEPTH = 100
_NON_LITERAL = set("|.()[]{}*+?^$")
UNSAFE = '"\\\\\\x00-\\x1F\\x7F'
DOT = f"[^{UNSAFE}]"
_CLASS_RANGES = {"d": DIGITS, "w": WORD, "s": " \t"}
_SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_JSON_ESCAPES = {
    '"': '\\\\\\"',
    "\\": "\\\\\\\\",
    "\n": "\\\\n",
    "\t": "\\\\t",
    "\r": "\\\\r",
    "\b": "\\\\b",
    "\f": "\\\\f",
}
"""How a character JSON must escape is spelt in the JSON text, written as a GBNF literal's body."""


def json_literal(ch: str) -> str:
    """``ch`` as it appears in a JSON string's text, as the body of a GBNF literal."""
    if ch in _JSON_ESCAPES:
        return _JSON_ESCAPES[ch]
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\\\u{ord(ch):04x}"
    return ch


def _class_char(code: int) -> str:
    ch = chr(code)
    if 0x20 < code < 0x7F and ch not in "]\\-^[":
        return ch
    return f"\\x{code:02X}" if code < 0x100 else (f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}")


_UNSAFE_CODES = [*range(0x20), 0x22, 0x5C, 0x7F]


def class_rule(ranges: list[tuple[int, int]], negated: bool) -> str:
    """A GBNF expression for one character of a JSON string that the class allows: plain where JSON allows
    the character plain, its escape where JSON needs one (a negated class never writes an escaped one)."""
    if negated:
        return f"[^{_ranges(ranges)}{UNSAFE}]"
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    safe: list[tuple[int, int]] = []
    escaped: list[str] = []
    for lo, hi in merged:
        start = lo
        for code in _UNSAFE_CODES:
            if lo <= code <= hi:
                if start < code:
                    safe.append((start, code - 1))
                start = code + 1
                escaped.append(chr(code))
        if start <= hi:
            safe.append((start, hi))
    parts = [f"[{_ranges(safe)}]"] if safe else []
    parts += [f'"{json_literal(ch)}"' for ch in dict.fromkeys(escaped)]
    if not parts:
        raise Unsupported("an empty character class")
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _ranges(ranges: list[tuple[int, int]]) -> str:
    return "".join(_class_char(lo) + ("" if lo == hi else "-" + _class_char(hi)) for lo, hi in ranges)


def _escaped_char(pattern: str, pos: int) -> tuple[str | None, int]:
    """The character an escape at ``pos`` stands for, and the escape's length (None: not one read here)."""
    nxt = pattern[pos + 1] if pos + 1 < len(pattern) else ""
    if nxt in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[nxt], 2
    n_hex = {"x": 2, "u": 4}.get(nxt)
    if n_hex is not None:
        digits = pattern[pos + 2 : pos + 2 + n_hex]
        if len(digits) == n_hex and all(h in "0123456789abcdefABCDEF" for h in digits):
            return chr(int(digits, 16)), 2 + n_hex
        return None, 0
    if nxt and not nxt.isalnum():
        return nxt, 2
    return None, 0


_NEGATED_ESCAPES = {"D": "0-9", "W": "a-zA-Z0-9_", "S": " \\t\\n\\r"}
_CLASS_ESCAPES = frozenset(_CLASS_RANGES) | frozenset(_NEGATED_ESCAPES)


def pattern_rule(
    pattern: str,
    name: str,
    add_rule: Callable[[str, str], str],
    repetition: Callable[[str, int, int | None], str],
) -> str:
    """The GBNF body (quotes included) for JSON strings matching ``pattern``; ``add_rule`` names sub-rules,
    ``repetition`` writes (and bounds) ``{m,n}``. Raises ``Unsupported``. Alternatives at the top with anchors
    of their own (``^a|^b-c$``) are each anchored as written."""
    alternatives = top_level_alternatives(pattern)
    if len(alternatives) > 1 and any(
        a.startswith("^") or (a.endswith("$") and not a.endswith("\\$")) for a in alternatives
    ):
        rules = [_one(a, f"{name}-{i}", add_rule, repetition) for i, a in enumerate(alternatives)]
        return f'"\\"" ({" | ".join(f"({r})" for r in rules)}) "\\""'
    return f'"\\"" ({_one(pattern, name, add_rule, repetition)}) "\\""'


def _one(
    pattern: str,
    name: str,
    add_rule: Callable[[str, str], str],
    repetition: Callable[[str, int, int | None], str],
) -> str:
    if not pattern.startswith("^"):
        pattern = "^.*" + pattern
    if not pattern.endswith("$") or pattern.endswith("\\$"):
        pattern = pattern + ".*$"
    sub = pattern[1:-1]
    length = len(sub)
    sub_rule_ids: dict[str, str] = {}
    state = {"i": 0, "depth": 0}

    def to_rule(item: tuple[str, bool]) -> str:
        text, is_literal = item
        return f'"{text}"' if is_literal else text

    def join(seq: list[tuple[str, bool]]) -> tuple[str, bool]:
        """One expression of ``seq``, each run of literals as one literal."""
        runs = groupby(seq, key=lambda item: item[1])
        texts = [(is_literal, [text for text, _ in run]) for is_literal, run in runs]
        return " ".join(f'"{"".join(t)}"' if is_literal else " ".join(t) for is_literal, t in texts), False

    def char_class() -> str:
        i = state["i"] + 1
        negated = i < length and sub[i] == "^"
        if negated:
            i += 1
        items: list[tuple[str, bool]] = []  # (character, escaped) as the class lists them
        while i < length and sub[i] != "]":
            if sub[i] == "\\":
                nxt = sub[i + 1] if i + 1 < length else ""
                if nxt in _CLASS_RANGES:
                    items += [(c, True) for c in _CLASS_RANGES[nxt]]
                    i += 2
                    continue
                ch, n = _escaped_char(sub, i)
                if ch is None:
                    raise Unsupported(f"unsupported escape in a character class: {sub[i : i + 2]}")
                items.append((ch, True))
                i += n
            else:
                items.append((sub[i], False))
                i += 1
        if i >= length:
            raise Unsupported("unterminated character class")
        state["i"] = i + 1
        ranges: list[tuple[int, int]] = []
        k = 0
        while k < len(items):
            if k + 2 < len(items) and items[k + 1] == ("-", False) and len(items[k][0]) == 1:
                lo, hi = ord(items[k][0]), ord(items[k + 2][0])
                if lo > hi:
                    raise Unsupported("a range out of order in a character class")
                ranges.append((lo, hi))
                k += 3
            else:
                ranges.append((ord(items[k][0]), ord(items[k][0])))
                k += 1
        return class_rule(ranges, negated)

    def transform() -> tuple[str, bool]:
        seq: list[tuple[str, bool]] = []
        while state["i"] < length:
            i = state["i"]
            c = sub[i]
            if c == ".":
                seq.append((add_rule("dot", DOT), False))
                state["i"] += 1
            elif c == "(":
                state["i"] += 1
                if state["i"] < length and sub[state["i"]] == "?":
                    if state["i"] + 1 < length and sub[state["i"] + 1] == ":":
                        state["i"] += 2
                    else:
                        raise Unsupported("lookarounds, named groups and inline flags are not supported")
                state["depth"] += 1
                if state["depth"] > MAX_PATTERN_DEPTH:
                    raise Unsupported(f"groups nest deeper than {MAX_PATTERN_DEPTH}")
                seq.append((f"({to_rule(transform())})", False))
            elif c == ")":
                state["i"] += 1
                if state["depth"] == 0:
                    raise Unsupported("unbalanced parentheses")
                state["depth"] -= 1
                return join(seq)
            elif c in "^$":
                raise Unsupported("an anchor inside the pattern")
            elif c == "[":
                seq.append((char_class(), False))
            elif c == "|":
                seq.append(("|", False))
                state["i"] += 1
            elif c in "*+?":
                if not seq:
                    raise Unsupported("nothing to repeat")
                seq[-1] = (to_rule(seq[-1]) + c, False)
                state["i"] += 1
            elif c == "{":
                end = sub.find("}", i)
                if end < 0:
                    raise Unsupported("unterminated curly brackets")
                nums = sub[i + 1 : end].split(",")
                state["i"] = end + 1
                if nums == [""] or len(nums) > 2 or not all(n.strip().isdigit() or n == "" for n in nums):
                    raise Unsupported("invalid numbers in curly brackets")
                min_times = int(nums[0]) if nums[0] else 0
                max_times = min_times if len(nums) == 1 else int(nums[1]) if nums[1] else None
                if not seq:
                    raise Unsupported("nothing to repeat")
                text, is_literal = seq[-1]
                if not is_literal:
                    if text not in sub_rule_ids:
                        sub_rule_ids[text] = add_rule(f"{name}-{len(sub_rule_ids) + 1}", text)
                    text = sub_rule_ids[text]
                seq[-1] = (repetition(to_rule((text, is_literal)), min_times, max_times), False)
            elif c == "\\" and sub[i + 1 : i + 2] in _CLASS_ESCAPES:
                nxt = sub[i + 1]
                cls = (
                    class_rule([(ord(c), ord(c)) for c in _CLASS_RANGES[nxt]], False)
                    if nxt in _CLASS_RANGES
                    else f"[^{_NEGATED_ESCAPES[nxt]}{UNSAFE}]"
                )
                seq.append((cls, False))
                state["i"] += 2
            else:
                seq.append((literal_run(), True))
        return join(seq)

    def literal_run() -> str:
        literal = ""
        i = state["i"]
        while i < length:
            ch = sub[i]
            if ch == "\\":
                if i == length - 1:
                    raise Unsupported("trailing backslash")
                if sub[i + 1] in _CLASS_ESCAPES:
                    break
                char, n = _escaped_char(sub, i)
                if char is None:
                    raise Unsupported(f"unsupported escape: {sub[i : i + 2]}")
            elif ch in _NON_LITERAL and ch not in "]}":  # a bracket no class or count opened is itself
                break
            else:
                char, n = ch, 1
            quantified = i + n < length and sub[i + n] in "*+?{"
            if quantified and literal:
                break  # the quantifier applies to this character alone
            literal += json_literal(char)
            i += n
            if quantified:
                break
        if not literal:
            raise Unsupported(f"unsupported character: {sub[state['i']]}")
        state["i"] = i
        return literal

    rule = to_rule(transform())
    if state["depth"] != 0:
        raise Unsupported("unbalanced parentheses")
    return rule
