"""JSON Schema to GBNF, clover-local's own port of llama.cpp's ``common/json-schema-to-grammar.cpp`` and
``common/json-schema.cpp`` (pure Python, no llama_cpp import), bounded by :class:`Limits`. Every sentence of a
grammar it writes is a JSON text the schema accepts; what it cannot enforce exactly is a
:class:`SchemaRefused` naming the keyword and its path."""

from clover_local.engine.schema_gbnf.converter import Converter, schema_grammar
from clover_local.engine.schema_gbnf.limits import LIMITS, Limits, SchemaRefused

__all__ = ["LIMITS", "Converter", "Limits", "SchemaRefused", "schema_grammar"]
