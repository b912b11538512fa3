"""A request's JSON schemas (tool parameters, ``response_format``) checked against the JSON Schema
meta-schema before anything is built from them: ``{"enum": "abc"}`` or ``"minLength": "3"`` is a 400 naming
the field, never a grammar of letters or a Python comparison error later. The draft is the schema's
``$schema``, else 2020-12 (what pydantic v2 and OpenAI's Structured Outputs write)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import jsonschema.validators

from clover_local.serve import api_errors as oa


def check_schema(schema: Any, param: str) -> None:
    """``schema`` is a JSON schema object, valid for its draft; else a 400 naming where it is not."""
    if not isinstance(schema, dict):
        raise oa.ApiError(400, f"{param} must be a JSON schema object.", param=param, code="invalid_schema")
    try:
        json.dumps(schema)
    except (TypeError, ValueError):
        raise oa.ApiError(400, f"{param} is not plain JSON.", param=param, code="invalid_schema") from None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = param + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise oa.ApiError(
            400, f"{where} is not valid JSON Schema: {exc.message}", param=where, code="invalid_schema"
        ) from None
    except RecursionError:
        raise oa.ApiError(400, f"{param} nests too deeply.", param=param, code="invalid_schema") from None
