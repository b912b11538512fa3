"""Real shapes of structured-output schemas: what pydantic v2 writes for typical models, and coding agents'
tool definitions. Each entry: a schema, instances it accepts, and instances it refuses (shared by the fast
grammar test and the slow model tests)."""

from __future__ import annotations

import datetime
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, Field

FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def validate(instance: Any, schema: dict[str, Any]) -> None:
    """``jsonschema.validate`` with ``format`` checked (plain ``validate`` treats it as an annotation, so a
    reply's date-time, email or hostname would go unchecked)."""
    jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER).validate(instance)


class Item(BaseModel):
    sku: Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{4}$")]
    qty: int = Field(ge=1)
    price: float = Field(gt=0, le=10_000)


class Order(BaseModel):
    id: int = Field(ge=1, le=2**31 - 1)
    status: Literal["new", "paid", "shipped"]
    items: list[Item] = Field(min_length=1, max_length=5)
    note: str | None = None
    placed: datetime.datetime


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=40)
    age: int = Field(ge=0, le=130)
    email: str | None = Field(default=None, json_schema_extra={"format": "email"})
    tags: list[Literal["a", "b", "c"]] = Field(default_factory=list, max_length=3)


class Tree(BaseModel):
    label: str = Field(max_length=20)
    children: list[Tree] = Field(default_factory=list, max_length=3)


class Port(BaseModel):
    host: str = Field(json_schema_extra={"format": "hostname"})
    port: int = Field(ge=1024, le=65535)
    weight: float = Field(ge=0, lt=1)


READ_FILE = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Absolute path", "minLength": 1, "maxLength": 256},
        "start_line": {"type": "integer", "minimum": 1},
        "end_line": {"type": "integer", "minimum": 1},
    },
    "required": ["path"],
    "additionalProperties": False,
}
GLOB = {
    "type": "object",
    "properties": {
        "pattern": {"type": "string", "description": "Glob such as src/**/*.py", "maxLength": 200},
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
    },
    "required": ["pattern"],
}
EDIT = {
    "type": "object",
    "properties": {
        "file_path": {"type": "string"},
        "mode": {"type": "string", "enum": ["replace", "insert", "delete"]},
        "edits": {
            "type": "array",
            "minItems": 1,
            "maxItems": 4,
            "items": {
                "type": "object",
                # Bounded as many agents' edit tools bound them: at greedy, SmolLM2 fills an unbounded string
                # with one digit run until the token limit, a reply no grammar can end.
                "properties": {
                    "old": {"type": "string", "maxLength": 40},
                    "new": {"type": "string", "maxLength": 40},
                },
                "required": ["old", "new"],
            },
        },
        "dry_run": {"type": "boolean"},
    },
    "required": ["file_path", "mode", "edits"],
}

CORPUS: dict[str, tuple[dict[str, Any], list[Any], list[Any]]] = {
    # Valid instances list properties as the grammar (like llama.cpp's) writes them: required ones first, in
    # the schema's order, then the optional ones.
    "order": (
        Order.model_json_schema(),
        [
            {"id": 7, "status": "paid", "items": [{"sku": "ABC-1234", "qty": 2, "price": 9.5}],
             "placed": "2025-01-02T03:04:05Z"},
            {"id": 1, "status": "new", "items": [{"sku": "XYZ-0001", "qty": 1, "price": 10000}],
             "placed": "2025-01-02T03:04:05+02:00", "note": None},
        ],
        [
            {"id": 7, "status": "lost", "placed": "2025-01-02T03:04:05Z",
             "items": [{"sku": "ABC-1234", "qty": 2, "price": 9.5}]},
            {"id": 7, "status": "new", "placed": "2025-01-02T03:04:05Z",
             "items": [{"sku": "ABC-1234", "qty": 0, "price": 9.5}]},
            {"id": 7, "status": "new", "placed": "2025-01-02T03:04:05Z", "items": []},
        ],
    ),
    "person": (
        Person.model_json_schema(),
        [{"name": "Ana", "age": 31, "email": "ana@example.org", "tags": ["a"]}, {"name": "B", "age": 0}],
        [{"name": "", "age": 31}, {"name": "Ana", "age": 131}, {"name": "Ana", "age": 3, "tags": ["d"]}],
    ),
    "tree": (
        Tree.model_json_schema(),
        [{"label": "root", "children": [{"label": "leaf", "children": []}]}],
        [{"label": "x" * 21}],
    ),
    "port": (
        Port.model_json_schema(),
        [{"host": "db.local", "port": 5432, "weight": 0.5}],
        [{"host": "db.local", "port": 80, "weight": 0.5}, {"host": "db.local", "port": 5432, "weight": 1}],
    ),
    "read_file": (READ_FILE, [{"path": "/src/a.py", "start_line": 3, "end_line": 9}], [{"path": "/a", "start_line": 0}]),
    "glob": (GLOB, [{"pattern": "src/**/*.py", "limit": 50}], [{"pattern": "*", "limit": 0}]),
    "edit": (
        EDIT,
        [{"file_path": "a.py", "mode": "replace", "edits": [{"old": "x", "new": "y"}], "dry_run": True}],
        [{"file_path": "a.py", "mode": "move", "edits": [{"old": "x", "new": "y"}]}],
    ),
}  # fmt: skip
