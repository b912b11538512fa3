"""The fixed GBNF rules the converter builds on: llama.cpp's ``PRIMITIVE_RULES`` and ``STRING_FORMAT_RULES``
(``common/json-schema-to-grammar.cpp``; its ``date`` made exact), plus the string formats OpenAI's Structured
Outputs lists that llama.cpp leaves unchecked (email, hostname, ipv4, ipv6, duration), each a subset of what the
format allows."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuiltinRule:
    content: str
    deps: tuple[str, ...] = ()


SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

PRIMITIVE_RULES: dict[str, BuiltinRule] = {
    "boolean": BuiltinRule('("true" | "false")'),
    "decimal-part": BuiltinRule("[0-9]{1,16}"),
    "integral-part": BuiltinRule("[0] | [1-9] [0-9]{0,15}"),
    "number": BuiltinRule(
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
        ("integral-part", "decimal-part"),
    ),
    "integer": BuiltinRule('("-"? integral-part)', ("integral-part",)),
    "value": BuiltinRule(
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": BuiltinRule(
        '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
        ("string", "value"),
    ),
    "array": BuiltinRule('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": BuiltinRule(
        '"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\""'
    ),
    # No surrogate escapes: a pair reads as one character (a length bound counts it as one) and a lone one
    # is no character at all.
    "char": BuiltinRule(
        '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))'
    ),
    "string": BuiltinRule('"\\"" char* "\\""', ("char",)),
    "null": BuiltinRule('"null"'),
}

_LABEL = "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,60} [a-zA-Z0-9])?"
_PLAIN_LABEL = "[a-z0-9] [a-z0-9]{0,61}"
"""A label IDNA takes as it is: lower-case letters and digits, no hyphen (``xn--`` labels are punycode)."""
_OCTET = '("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])'
_H16 = "[0-9a-fA-F]{1,4}"
_N = "[0-9]{1,9}"

STRING_FORMAT_RULES: dict[str, BuiltinRule] = {
    # Exact calendar dates (llama.cpp's rule allows 2023-02-30, which no date-time parser takes): years
    # 0001-9999, each month's own days, February 29th only in leap years.
    "date": BuiltinRule(
        'date-year "-" ( "0" [13578] "-" date-day31 | "1" [02] "-" date-day31 | "0" [469] "-" date-day30 '
        '| "11" "-" date-day30 | "02" "-" date-day28 ) | date-leap-year "-02-29"',
        ("date-year", "date-leap-year", "date-day28", "date-day30", "date-day31"),
    ),
    "date-year": BuiltinRule('[0-9]{3} [1-9] | [0-9]{2} [1-9] "0" | [0-9] [1-9] "00" | [1-9] "000"'),
    "date-leap-year": BuiltinRule(
        '[0-9]{2} ( [02468] [48] | [13579] [26] | [2468] "0" ) | ( [02468] [48] | [13579] [26] | [2468] "0" ) "00"'
    ),
    "date-day28": BuiltinRule('"0" [1-9] | "1" [0-9] | "2" [0-8]'),
    "date-day30": BuiltinRule('date-day28 | "29" | "30"', ("date-day28",)),
    "date-day31": BuiltinRule('date-day30 | "31"', ("date-day30",)),
    "time": BuiltinRule(
        '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
        '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )'
    ),
    "date-time": BuiltinRule('date "T" time', ("date", "time")),
    "date-string": BuiltinRule('"\\"" date "\\""', ("date",)),
    "time-string": BuiltinRule('"\\"" time "\\""', ("time",)),
    "date-time-string": BuiltinRule('"\\"" date-time "\\""', ("date-time",)),
    "hostname": BuiltinRule(f'{_LABEL} ("." {_LABEL}){{0,3}}'),
    "hostname-string": BuiltinRule('"\\"" hostname "\\""', ("hostname",)),
    "email-string": BuiltinRule(
        f'"\\"" [a-zA-Z0-9_%+-] ([a-zA-Z0-9._%+-]{{0,62}} [a-zA-Z0-9_%+-])? "@" {_LABEL} ("." {_LABEL}){{1,3}} "\\""'
    ),
    "ipv4-string": BuiltinRule(f'"\\"" {_OCTET} "." {_OCTET} "." {_OCTET} "." {_OCTET} "\\""'),
    "ipv6-string": BuiltinRule(f'"\\"" {_H16} (":" {_H16}){{7}} "\\""'),
    "duration-string": BuiltinRule(
        f'"\\"" "P" ( ( {_N} "Y" ({_N} "M")? ({_N} "D")? | {_N} "M" ({_N} "D")? | {_N} "D" ) ("T" duration-time)? '
        f'| "T" duration-time | {_N} "W" ) "\\""',
        ("duration-time",),
    ),
    "idn-hostname-string": BuiltinRule(f'"\\"" {_PLAIN_LABEL} ("." {_PLAIN_LABEL}){{0,3}} "\\""'),
    "uri": BuiltinRule(
        f'"http" "s"? "://" {_LABEL} ("." {_LABEL}){{0,3}} ("/" [a-zA-Z0-9._~-]{{0,40}}){{0,6}}'
    ),
    "uri-string": BuiltinRule('"\\"" uri "\\""', ("uri",)),
    "json-pointer": BuiltinRule('("/" ([a-zA-Z0-9._-] | "~" [01]){0,30}){1,8}'),
    "json-pointer-string": BuiltinRule('"\\"" json-pointer "\\""', ("json-pointer",)),
    "relative-json-pointer-string": BuiltinRule(
        '"\\"" ("0" | [1-9] [0-9]{0,5}) ("#" | json-pointer) "\\""', ("json-pointer",)
    ),
    "regex-string": BuiltinRule('"\\"" [a-zA-Z0-9 _-]{1,200} "\\""'),
    "color-string": BuiltinRule('"\\"" "#" [0-9a-f]{6} "\\""'),
    "duration-time": BuiltinRule(f'{_N} "H" ({_N} "M")? ({_N} "S")? | {_N} "M" ({_N} "S")? | {_N} "S"'),
}

FORMATS: dict[str, tuple[str, int, int]] = {
    "date": ("date-string", 10, 10),
    "time": ("time-string", 9, 18),
    "date-time": ("date-time-string", 20, 29),
    "uuid": ("uuid", 36, 36),
    "ipv4": ("ipv4-string", 7, 15),
    "ipv6": ("ipv6-string", 15, 39),
    "hostname": ("hostname-string", 1, 255),
    "email": ("email-string", 5, 316),
    "duration": ("duration-string", 3, 80),
    "idn-email": ("email-string", 5, 316),
    "idn-hostname": ("idn-hostname-string", 1, 251),
    "uri": ("uri-string", 8, 546),
    "uri-reference": ("uri-string", 8, 546),
    "iri": ("uri-string", 8, 546),
    "iri-reference": ("uri-string", 8, 546),
    "uri-template": ("uri-string", 8, 546),
    "json-pointer": ("json-pointer-string", 1, 496),
    "relative-json-pointer": ("relative-json-pointer-string", 2, 503),
    "regex": ("regex-string", 1, 200),
    "color": ("color-string", 7, 7),
}
"""The string formats the grammar enforces: the builtin rule each becomes, and the shortest and longest value it
writes (characters, to check length bounds beside it). Every format ``jsonschema`` can check, each a subset of
what the format allows (a ``uri`` is an ``http(s)://`` address, a ``regex`` letters, digits, spaces, ``_`` and
``-``), so a reply passes whichever checkers are installed."""

RESERVED_NAMES = frozenset({"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES})


def builtin(name: str) -> BuiltinRule:
    return PRIMITIVE_RULES.get(name) or STRING_FORMAT_RULES[name]
