"""A reply judged by a task's checks. A malformed reply (not JSON, arguments that do not parse, a regex that
backtracks past its limit) fails its check, saying why; it never stops the run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clover_local.compare.saferegex import RegexTimeout, SafeRegex
from clover_local.compare.tasks import Check
from clover_local.engine.types import ToolCall

MAX_JSON_STARTS = 200
"""``contains-json`` tries at most this many ``{`` / ``[`` positions of a reply."""


@dataclass(frozen=True)
class Reply:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class CheckResult:
    type: str
    passed: bool
    why: str = ""
    """Why it failed (empty when it passed)."""


def run_check(check: Check, reply: Reply, regex: SafeRegex) -> CheckResult:
    """One check on one reply."""
    text, value = reply.text, check.value
    if check.type == "contains":
        return _result(check, value in text, f"the reply does not contain {value!r}")
    if check.type == "icontains":
        return _result(
            check, value.lower() in text.lower(), f"the reply does not contain {value!r} (any case)"
        )
    if check.type == "equals":
        return _result(check, text.strip() == value.strip(), f"the reply is not {value!r}")
    if check.type == "regex":
        try:
            found = regex.search(value, text)
        except RegexTimeout as exc:
            return CheckResult(check.type, False, str(exc))
        except ValueError as exc:
            return CheckResult(check.type, False, f"the regex failed: {exc}")
        return _result(check, found, f"no match for {value!r}")
    if check.type == "is-json":
        return _is_json(check, text)
    if check.type == "contains-json":
        return _contains_json(check, text)
    return _tool_call(check, reply.tool_calls)


def _result(check: Check, passed: bool, why: str) -> CheckResult:
    return CheckResult(check.type, passed, "" if passed else why)


def json_text(text: str) -> str:
    """The reply without one Markdown code fence around it (```json ... ```), as models often write JSON."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and len(stripped) >= 6:
        body = stripped[3:-3]
        first_newline = body.find("\n")
        if first_newline >= 0 and body[:first_newline].strip().isidentifier():
            body = body[first_newline + 1 :]
        return body.strip()
    return stripped


def _is_json(check: Check, text: str) -> CheckResult:
    try:
        value = json.loads(json_text(text))
    except ValueError as exc:
        return CheckResult(check.type, False, f"the reply is not JSON ({exc})")
    except RecursionError:
        return CheckResult(check.type, False, "the reply's JSON nests too deeply")
    return _matches(check, [value], "the JSON does not match the schema")


def _contains_json(check: Check, text: str) -> CheckResult:
    found = find_json(text)
    if not found:
        return CheckResult(check.type, False, "the reply holds no JSON object or array")
    return _matches(check, found, "no JSON in the reply matches the schema")


def _matches(check: Check, values: list[Any], failed: str) -> CheckResult:
    """Passed when one of ``values`` matches the check's schema (any does without one)."""
    if check.value is None:
        return CheckResult(check.type, True)
    problems = [schema_problem(check.value, v) for v in values]
    return _result(check, None in problems, f"{failed}: {problems[0]}")


def find_json(text: str) -> list[Any]:
    """Every JSON object or array written in ``text`` (outermost ones, left to right)."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    position, tries = 0, 0
    while tries < MAX_JSON_STARTS:
        starts = [i for i in (text.find("{", position), text.find("[", position)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        tries += 1
        try:
            value, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            position = start + 1
            continue
        out.append(value)
        position = end
    return out


def schema_problem(schema: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` does not match ``schema`` (checked when the tasks file was read), or None."""
    import jsonschema
    import jsonschema.validators

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        error = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    except RecursionError:
        return "the JSON nests too deeply"
    return None if error is None else error.message


def _tool_call(check: Check, calls: Sequence[ToolCall]) -> CheckResult:
    name, wanted = check.value["name"], check.value["arguments"]
    if not calls:
        return CheckResult(check.type, False, f"the reply calls no tool (expected {name})")
    named = [c for c in calls if c.name == name]
    if not named:
        return CheckResult(
            check.type, False, f"the reply calls {', '.join(c.name for c in calls)}, not {name}"
        )
    problem = ""
    for call in named:
        try:
            arguments = json.loads(call.arguments or "{}")
        except (ValueError, RecursionError):
            problem = f"the arguments of {name} are not JSON"
            continue
        if not isinstance(arguments, dict):
            problem = f"the arguments of {name} are not an object"
            continue
        missing = [k for k, v in wanted.items() if k not in arguments or not json_equal(arguments[k], v)]
        if not missing:
            return CheckResult(check.type, True)
        problem = f"{name} was called with {_arg_text(arguments, missing)}"
    return CheckResult(check.type, False, problem)


def _arg_text(arguments: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={json.dumps(arguments[k])}" if k in arguments else f"no {k}" for k in keys)


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``1 == 1.0``, but ``true`` is not ``1``, and objects compare key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
