"""The real-world schema corpus (``tests/data/schema_corpus/``) and the soundness check run on it: each schema
is turned into a grammar or refused; random sentences of each grammar are validated with ``jsonschema``,
formats checked. Shared by ``tests/test_schema_corpus.py`` and ``benchmarks/schema_corpus_report.py``."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema.validators

from clover_local.engine.schema_gbnf import SchemaRefused
from tests.gbnf_sample import Endless, Sampler

DATA = Path(__file__).parent / "data" / "schema_corpus"


@dataclass(frozen=True)
class Entry:
    name: str
    source: str
    schema: dict[str, Any]

    @property
    def origin(self) -> str:
        return self.name.split("/", 1)[0]


def entries() -> list[Entry]:
    out = []
    for path in sorted(DATA.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            out += [Entry(**json.loads(line)) for line in lines]
    return out


@dataclass(frozen=True)
class Outcome:
    grammar: str | None
    refusal: SchemaRefused | None


def convert(build: Callable[[dict[str, Any]], str], schema: dict[str, Any]) -> Outcome:
    try:
        return Outcome(build(schema), None)
    except SchemaRefused as refused:
        return Outcome(None, refused)


def validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """The schema's own draft, formats checked (the draft's checker: jsonschema checks a format only where its
    library is installed, as the test extra installs them)."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def violations(grammar: str, schema: dict[str, Any], samples: int, seed: int) -> Iterator[tuple[str, str]]:
    """(sentence, why) for each random sentence of ``grammar`` that is not JSON ``schema`` accepts."""
    sampler = Sampler(grammar, seed)
    check = validator(schema)
    for _ in range(samples):
        try:
            text = sampler.sentence()
        except Endless as exc:
            yield "", str(exc)
            return
        try:
            value = json.loads(text)
        except ValueError as exc:
            yield text, f"not JSON: {exc}"
            continue
        error = jsonschema.exceptions.best_match(check.iter_errors(value))
        if error is not None:
            yield text, f"{error.message} at {error.json_path}"


def resolve_pointer(schema: Any, path: str) -> Any:
    """The value at a refusal's path (``#/a/b``, RFC 6901); KeyError when there is none."""
    node = schema
    if path == "#":
        return node
    if not path.startswith("#/"):
        raise KeyError(path)
    for token in path[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise KeyError(f"{path}: {token!r}")
    return node


def mentions(node: Any, keyword: str) -> bool:
    """Whether ``keyword`` is a key somewhere in ``node`` (a refusal's keyword lies at or under its path)."""
    if isinstance(node, dict):
        return keyword in node or any(mentions(v, keyword) for v in node.values())
    if isinstance(node, list):
        return any(mentions(v, keyword) for v in node)
    return False
