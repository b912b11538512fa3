"""A tasks file: one task each, an ``id``, a ``prompt`` or ``messages``, optional ``tools``, and ``assert``, a list of
checks named as promptfoo names them. JSONL (one task per line) or YAML (a list of tasks, or ``tasks:`` holding
one). Everything is checked here, before any model loads: an unknown check, a regex that does not compile or a
JSON schema that is not one is refused with the line and what to fix.

A tasks file may come from anyone, so what it may cost is bounded (:class:`Limits`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from clover_local.engine.types import ChatMessage, Role, ToolSpec
from clover_local.errors import UsageError

CheckType = Literal["contains", "icontains", "equals", "regex", "is-json", "contains-json", "tool-call"]
CHECK_TYPES: tuple[str, ...] = get_args(CheckType)
BUILTIN = "builtin"
"""``--tasks builtin``: the suite shipped with clover-local (``builtin.jsonl``)."""
_ROLES: tuple[str, ...] = get_args(Role)


@dataclass(frozen=True)
class Limits:
    """What a tasks file may ask for."""

    max_file_bytes: int = 4 * 1024 * 1024
    max_tasks: int = 1000
    max_checks: int = 32
    """Checks of one task."""
    max_pattern_chars: int = 1000
    """One ``regex`` (as the server bounds a schema's ``pattern``)."""
    max_id_chars: int = 128


LIMITS = Limits()


class TaskFileError(UsageError):
    """A tasks file that cannot be run: says where (file and line) and what to fix."""


@dataclass(frozen=True)
class Check:
    type: CheckType
    value: Any = None
    """The text (contains, icontains, equals, regex), the JSON schema (is-json, contains-json; None: any JSON),
    or ``{"name", "arguments"}`` (tool-call)."""


@dataclass(frozen=True)
class Task:
    id: str
    messages: tuple[ChatMessage, ...]
    checks: tuple[Check, ...]
    tools: tuple[ToolSpec, ...] = ()
    line: int = 0
    """Where the task starts in its file (1-based)."""


@dataclass(frozen=True)
class TaskSet:
    source: str
    """``builtin`` or the file's path, as given."""
    tasks: tuple[Task, ...]
    digest: str
    """sha256 of the file's bytes: a resumed run must run the same tasks."""
    ids: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", tuple(t.id for t in self.tasks))


def load_tasks(source: str, limits: Limits = LIMITS) -> TaskSet:
    """The tasks of ``source`` (``builtin``, or a ``.jsonl`` / ``.yaml`` / ``.yml`` file), all checked."""
    if source == BUILTIN:
        data = resources.files("clover_local.compare").joinpath("builtin.jsonl").read_bytes()
        return parse_tasks(data, "builtin.jsonl", source=BUILTIN, limits=limits)
    path = Path(source).expanduser()
    try:
        with path.open("rb") as f:
            data = f.read(
                limits.max_file_bytes + 1
            )  # one byte more: parse_tasks refuses a file over the limit
    except OSError as exc:
        raise TaskFileError(
            f"Cannot read the tasks file {source}: {exc.strerror or exc}.", "Give a .jsonl or .yaml file."
        ) from None
    return parse_tasks(data, path.name, source=source, limits=limits)


def parse_tasks(data: bytes, name: str, *, source: str | None = None, limits: Limits = LIMITS) -> TaskSet:
    """Tasks from a file's bytes; ``name`` (its file name) says the format and is how errors name it."""
    if len(data) > limits.max_file_bytes:
        raise TaskFileError(
            f"{name}: over the {limits.max_file_bytes} bytes a tasks file may have.", "Split it."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(f"{name}: not UTF-8 text (byte {exc.start}).", "Save it as UTF-8.") from None
    if name.endswith((".yaml", ".yml")):
        raw = _yaml_tasks(text, name)
    elif name.endswith(".jsonl"):
        raw = _jsonl_tasks(text, name)
    else:
        raise TaskFileError(f"{name}: not a tasks file.", "Give a .jsonl, .yaml or .yml file (or builtin).")
    if not raw:
        raise TaskFileError(f"{name}: no tasks in it.", "Add one task per line (JSONL) or a list (YAML).")
    if len(raw) > limits.max_tasks:
        raise TaskFileError(
            f"{name}: {len(raw)} tasks, over the {limits.max_tasks} one file may hold.", "Split it."
        )
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for line, item in raw:
        task = _task(item, _Where(name, line), limits)
        if task.id in seen:
            raise TaskFileError(
                f"{name} line {line}: the id {task.id!r} is used already (line {seen[task.id]}).",
                "Give every task its own id.",
            )
        seen[task.id] = line
        tasks.append(task)
    return TaskSet(source or name, tuple(tasks), hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class _Where:
    name: str
    line: int

    def fail(self, what: str, fix: str | None = None) -> TaskFileError:
        return TaskFileError(f"{self.name} line {self.line}: {what}", fix)


def _jsonl_tasks(text: str, name: str) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append((number, json.loads(line)))
        except ValueError as exc:
            raise TaskFileError(
                f"{name} line {number}: not JSON ({exc}).", "One task per line, each a JSON object."
            ) from None
        except RecursionError:
            raise TaskFileError(f"{name} line {number}: nests too deeply.") from None
    return out


def _yaml_tasks(text: str, name: str) -> list[tuple[int, Any]]:
    try:
        import yaml
    except ImportError:
        raise TaskFileError(
            f"{name}: reading YAML needs PyYAML, which is not installed.",
            "Install it (pip install pyyaml), or write the tasks as JSONL.",
        ) from None

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        """SafeLoader that keeps each mapping's line, and refuses aliases (a few bytes can name a huge tree)."""

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        value = loader.construct_mapping(node, deep=True)
        return {**value, "__line__": node.start_mark.line + 1}

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark else 0
                raise TaskFileError(
                    f"{name} line {line}: YAML aliases (*name) are not allowed in a tasks file.",
                    "Write the value out in full.",
                )
        doc = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise TaskFileError(f"{name}{where}: not valid YAML ({getattr(exc, 'problem', exc)}).") from None
    except RecursionError:
        raise TaskFileError(f"{name}: nests too deeply.") from None
    if isinstance(doc, dict) and "tasks" in doc:
        doc = doc["tasks"]
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise TaskFileError(f"{name}: the file must be a list of tasks (or hold one under tasks:).")
    return [(item.get("__line__", 0) if isinstance(item, dict) else 0, item) for item in doc]


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_lines(v) for k, v in value.items() if k != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(v) for v in value]
    return value


def _task(item: Any, where: _Where, limits: Limits) -> Task:
    if not isinstance(item, dict):
        raise where.fail("a task must be an object with id, prompt or messages, and assert.")
    item = _strip_lines(item)
    unknown = sorted(set(item) - {"id", "prompt", "messages", "tools", "assert", "description"})
    if unknown:
        raise where.fail(
            f"unknown field(s) {', '.join(unknown)}.", "A task has id, prompt or messages, tools, assert."
        )
    task_id = item.get("id")
    if not isinstance(task_id, str | int) or isinstance(task_id, bool) or not str(task_id).strip():
        raise where.fail("the task has no id.", 'Give it one: "id": "capital-of-france".')
    task_id = str(task_id).strip()
    if len(task_id) > limits.max_id_chars:
        raise where.fail(f"the id is longer than {limits.max_id_chars} characters.")
    messages = _messages(item, where)
    tools = _tools(item.get("tools"), where)
    checks = item.get("assert")
    if not isinstance(checks, list) or not checks:
        raise where.fail(
            f"task {task_id!r} has no assert list.", 'Add "assert": [{"type": "contains", ...}].'
        )
    if len(checks) > limits.max_checks:
        raise where.fail(f"task {task_id!r} has {len(checks)} checks, over {limits.max_checks}.")
    parsed = tuple(_check(c, where, limits, {t.name for t in tools}) for c in checks)
    return Task(task_id, messages, parsed, tools, where.line)


def _messages(item: dict[str, Any], where: _Where) -> tuple[ChatMessage, ...]:
    prompt, messages = item.get("prompt"), item.get("messages")
    if (prompt is None) == (messages is None):
        raise where.fail("a task needs exactly one of prompt and messages.")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise where.fail("prompt must be non-empty text.")
        return (ChatMessage("user", prompt),)
    if not isinstance(messages, list) or not messages:
        raise where.fail("messages must be a non-empty list of {role, content}.")
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise where.fail(
                f"each message needs a role ({', '.join(_ROLES)}) and text content.",
                '"messages": [{"role": "user", "content": "..."}]',
            )
        out.append(ChatMessage(m["role"], m["content"]))
    if out[-1].role == "assistant":
        raise where.fail("the last message is the assistant's: nothing is left for the model to answer.")
    return tuple(out)


def _tools(raw: Any, where: _Where) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise where.fail("tools must be a list of functions.")
    out = []
    for tool in raw:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise where.fail(
                "each tool needs a name.", '{"name": "get_weather", "parameters": {"type": "object", ...}}'
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        _check_schema(params, where, f"tool {fn['name']}'s parameters")
        out.append(ToolSpec(fn["name"], str(fn.get("description") or ""), params))
    return tuple(out)


def _check(raw: Any, where: _Where, limits: Limits, tools: set[str]) -> Check:
    if not isinstance(raw, dict) or "type" not in raw:
        raise where.fail("each check is an object with a type.", '{"type": "icontains", "value": "paris"}')
    kind, value = raw["type"], raw.get("value")
    if kind not in CHECK_TYPES:
        raise where.fail(f"unknown check {kind!r}.", f"Checks: {', '.join(CHECK_TYPES)}.")
    if kind in ("contains", "icontains", "equals", "regex") and (not isinstance(value, str) or not value):
        raise where.fail(f"check {kind} needs a non-empty text value.")
    if kind == "regex":
        assert isinstance(value, str)
        if len(value) > limits.max_pattern_chars:
            raise where.fail(f"the regex is longer than {limits.max_pattern_chars} characters.")
        try:
            re.compile(value)
        except (re.error, RecursionError, OverflowError) as exc:
            raise where.fail(
                f"the regex {value!r} does not compile ({exc}).", "Write a Python regular expression."
            ) from None
    if kind in ("is-json", "contains-json") and value is not None:
        _check_schema(value, where, f"the {kind} schema")
    if kind == "tool-call":
        value = _tool_call_value(value, where, tools)
    return Check(kind, value)


def _tool_call_value(value: Any, where: _Where, tools: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise where.fail(
            "check tool-call needs value {name, arguments}.",
            '{"type": "tool-call", "value": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
        )
    if tools and value["name"] not in tools:
        raise where.fail(f"tool-call expects {value['name']!r}, which the task's tools do not offer.")
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        raise where.fail("tool-call arguments must be an object.")
    return {"name": value["name"], "arguments": arguments}


def _check_schema(schema: Any, where: _Where, what: str) -> None:
    """``schema`` is valid JSON Schema for its draft (2020-12 unless it says), as ``serve`` checks requests."""
    import jsonschema
    import jsonschema.validators

    if not isinstance(schema, dict):
        raise where.fail(f"{what} must be a JSON schema object.")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise where.fail(
            f"{what} is not valid JSON Schema{' at ' + at if at else ''}: {exc.message}.",
            "Fix the schema (https://json-schema.org/understanding-json-schema/).",
        ) from None
    except RecursionError:
        raise where.fail(f"{what} nests too deeply.") from None
