"""The schema walk: llama.cpp's ``common_chat_schema_builder`` and ``common_chat_schema_converter`` in one
pass over the JSON, with the bounds of :mod:`.limits` checked before text is written. Each schema given to
:meth:`Converter.visit_document` is its own document: its ``$ref``s resolve against it, wherever its rule is
used (a tool's parameters inside a call object keep their references)."""

from __future__ import annotations

import re
from typing import Any

from clover_local.engine.schema_gbnf import numbers, pattern
from clover_local.engine.schema_gbnf.common import (
    INVALID_RULE_CHARS,
    Document,
    build_repetition,
    class_char,
    constant,
    count_of,
    properties_of,
    required_of,
    schema_list,
)
from clover_local.engine.schema_gbnf.keywords import beside, refuse_unenforceable, with_constraints
from clover_local.engine.schema_gbnf.limits import LIMITS, Limits, SchemaRefused
from clover_local.engine.schema_gbnf.rules import FORMATS, RESERVED_NAMES, SPACE_RULE, builtin


def schema_grammar(schema: dict[str, Any], limits: Limits = LIMITS) -> str:
    """A grammar (``root`` first) whose sentences are JSON texts ``schema`` accepts."""
    converter = Converter(limits)
    converter.visit_document(schema, "")
    return converter.format_grammar()


class Converter:
    """Rules for one grammar; ``visit_document`` adds a schema's rules and returns its rule name."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self._rules: dict[str, str] = {"space": SPACE_RULE}
        self._chars = len(SPACE_RULE)
        self._expanded = 0
        self._resolving: set[str] = set()
        self._documents = 0

    # --- output -----------------------------------------------------------------------------------------------

    def add_rule(self, name: str, rule: str) -> str:
        """``rule`` under ``name`` (or a numbered variant of it when the name holds another rule)."""
        esc = INVALID_RULE_CHARS.sub("-", name)
        key = esc
        if esc in self._rules and self._rules[esc] != rule:
            i = 0
            while f"{esc}{i}" in self._rules and self._rules[f"{esc}{i}"] != rule:
                i += 1
            key = f"{esc}{i}"
        if key not in self._rules:
            if len(self._rules) >= self.limits.max_rules:
                raise SchemaRefused("$", "#", f"the grammar needs more than {self.limits.max_rules} rules.")
            self._chars += len(key) + len(rule) + 5
            if self._chars > self.limits.max_grammar_chars:
                raise SchemaRefused(
                    "$", "#", f"the grammar is over {self.limits.max_grammar_chars} characters."
                )
        self._rules[key] = rule
        return key

    def format_grammar(self) -> str:
        """Every rule, ``root`` first (llama.cpp starts at ``root``), the rest by name."""
        names = sorted(self._rules, key=lambda n: (n != "root", n))
        return "".join(f"{n} ::= {self._rules[n]}\n" for n in names)

    def repetition(self, item: str, lo: int, hi: int | None, sep: str = "", *, where: tuple[str, str]) -> str:
        """``build_repetition``, after charging what llama.cpp's parser writes out for it."""
        keyword, path = where
        for count in (lo, hi):
            if count is not None and count > self.limits.max_count:
                raise SchemaRefused(keyword, path, f"{count} is over the limit of {self.limits.max_count}.")
        self._expanded += (max(lo, hi or 0) + 1) * (3 if sep else 1)
        if self._expanded > self.limits.max_expanded:
            raise SchemaRefused(
                keyword, path, f"the repetitions add up to over {self.limits.max_expanded} grammar elements."
            )
        return build_repetition(item, lo, hi, sep)

    def primitive(self, name: str) -> str:
        rule = builtin(name)
        key = self.add_rule(name, rule.content)
        for dep in rule.deps:
            if dep not in self._rules:
                self.primitive(dep)
        return key

    # --- the walk ---------------------------------------------------------------------------------------------

    def visit_document(self, schema: Any, name: str, *, root: Any = None) -> str:
        """The rule for ``schema`` in a document of its own: its ``$ref``s resolve against ``root`` (default:
        ``schema`` itself), wherever the rule is used."""
        self._documents += 1
        doc = Document(
            schema if root is None else root, f"d{self._documents}-" if self._documents > 1 else ""
        )
        return self._visit(schema, name, "#", doc, 0)

    def _visit(self, schema: Any, name: str, path: str, doc: Document, depth: int) -> str:
        if depth > self.limits.max_depth:
            raise SchemaRefused("$", path, f"schemas nest deeper than {self.limits.max_depth}.")
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        if schema is True or schema == {}:
            return self.add_rule(rule_name, self.primitive("value"))
        if not isinstance(schema, dict):
            raise SchemaRefused("$", path, "a schema must be an object (or true); false allows no value.")
        refuse_unenforceable(schema, path)
        if "$ref" in schema:
            return self.add_rule(rule_name, self._ref(schema["$ref"], path, doc, depth))
        for key in ("oneOf", "anyOf"):
            if key in schema:
                constraints = beside(schema, key)
                sub = name + ("-" if name else "alternative-")
                rules = [
                    self._visit(alt, f"{sub}{i}", f"{path}/{key}/{i}", doc, depth + 1)
                    for i, a in enumerate(schema_list(schema[key], key, path))
                    if (alt := with_constraints(a, constraints, f"{path}/{key}/{i}")) is not None
                ]
                if not rules:
                    raise SchemaRefused(
                        "type", path, f"no alternative of '{key}' has the type given beside it."
                    )
                return self.add_rule(rule_name, " | ".join(rules))
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise SchemaRefused("type", path, "must not be empty.")
            rules = [
                self._visit(
                    {**schema, "type": t},
                    f"{name}-{t}" if name else str(t),
                    f"{path}/type/{i}",
                    doc,
                    depth + 1,
                )
                for i, t in enumerate(kind)
            ]
            return self.add_rule(rule_name, " | ".join(rules))
        if "const" in schema:
            return self.add_rule(rule_name, constant(schema["const"]))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaRefused("enum", path, "must be a non-empty array.")
            if len(values) > self.limits.max_enum:
                raise SchemaRefused(
                    "enum", path, f"{len(values)} values, over the limit of {self.limits.max_enum}."
                )
            return self.add_rule(rule_name, "(" + " | ".join(constant(v) for v in values) + ")")
        if kind is not None and not isinstance(kind, str):
            raise SchemaRefused("type", path, "must be a string or an array of strings.")
        if "allOf" in schema:
            return self._all_of(schema, name, rule_name, path, doc, depth)
        has_props = "properties" in schema or schema.get("additionalProperties", True) is not True
        if kind is None:
            if has_props:
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
            elif any(k in schema for k in ("pattern", "minLength", "maxLength", "format")):
                kind = "string"
            else:
                return self.add_rule(rule_name, self.primitive("value"))
        return self._typed(schema, kind, name, rule_name, path, doc, depth)

    def _typed(self, schema: dict[str, Any], kind: str, name: str, rule_name: str, path: str, doc: Document,
               depth: int) -> str:  # fmt: skip
        sub = name + "-" if name else ""
        if kind == "object":
            body = self._object(
                properties_of(schema, path), required_of(schema, path), schema, name, path, doc, depth
            )
            return self.add_rule(rule_name, body)
        if kind == "array":
            return self.add_rule(rule_name, self._array(schema, sub, path, doc, depth))
        if kind == "string":
            return self._string(schema, rule_name, path)
        if kind in ("integer", "number"):
            return self.add_rule(
                rule_name, numbers.number_rule(self.primitive, self.limits.max_enum, schema, kind, path)
            )
        if kind in ("boolean", "null"):
            return (
                self.primitive(kind) if rule_name != "root" else self.add_rule("root", builtin(kind).content)
            )
        raise SchemaRefused("type", path, f"unrecognized type {kind!r}.")

    def _ref(self, ref: Any, path: str, doc: Document, depth: int) -> str:
        if not isinstance(ref, str):
            raise SchemaRefused("$ref", path, "must be a string.")
        target = doc.resolve(ref, path)
        ref_name = "ref" + doc.prefix + INVALID_RULE_CHARS.sub("-", ref[1:])
        key = doc.prefix + ref
        if ref_name not in self._rules and key not in self._resolving:
            self._resolving.add(key)
            try:
                ref_name = self._visit(target, ref_name, ref, doc, depth + 1)
            finally:
                self._resolving.discard(key)
        return ref_name

    def _object(self, properties: list[tuple[str, Any]], required: set[str], schema: dict[str, Any] | None,
                name: str, path: str, doc: Document, depth: int) -> str:  # fmt: skip
        sub = name + "-" if name else ""
        kv: dict[str, str] = {}
        required_props: list[str] = []
        optional_props: list[str] = []
        for prop, prop_schema in properties:
            rule = self._visit(prop_schema, sub + prop, f"{path}/properties/{prop}", doc, depth + 1)
            kv[prop] = self.add_rule(f"{sub}{prop}-kv", f'{constant(prop)} space ":" space {rule}')
            (required_props if prop in required else optional_props).append(prop)
        missing = required - set(kv)
        if missing:
            raise SchemaRefused(
                "required", path, f"names {sorted(missing)[0]!r}, which is not in 'properties'."
            )
        additional = schema.get("additionalProperties") if schema is not None else False
        if schema is not None and "additionalProperties" not in schema and "properties" not in schema:
            additional = True
        if additional is not False and additional is not None:
            value = (
                self.primitive("value")
                if additional is True or additional == {}
                else self._visit(
                    additional, f"{sub}additional-value", f"{path}/additionalProperties", doc, depth + 1
                )
            )
            if not kv and value == "value":
                return self.primitive("object")
            key_rule = (
                self.primitive("string")
                if not kv
                else self.add_rule(f"{sub}additional-k", self._not_strings(list(kv)))
            )
            kv["*"] = self.add_rule(f"{sub}additional-kv", f'{key_rule} ":" space {value}')
            optional_props.append("*")
        if not required_props and not optional_props:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[p] for p in required_props)
        if optional_props:
            rule += " ("
            if required_props:
                rule += ' "," space ( '

            def recursive_refs(ks: list[str], first_is_optional: bool) -> str:
                k = ks[0]
                comma_ref = f'( "," space {kv[k]} )'
                if first_is_optional:
                    res = comma_ref + ("*" if k == "*" else "?")
                else:
                    res = kv[k] + (f" {comma_ref}*" if k == "*" else "")
                if len(ks) > 1:
                    res += " " + self.add_rule(f"{sub}{k}-rest", recursive_refs(ks[1:], True))
                return res

            rule += " | ".join(recursive_refs(optional_props[i:], False) for i in range(len(optional_props)))
            if required_props:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def _not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of ``strings`` (an additional property's key)."""
        trie: dict[str, Any] = {}
        for s in strings:
            node = trie
            for ch in s:
                node = node.setdefault(ch, {})
            node[""] = {}
        char = self.primitive("char")

        def visit(node: dict[str, Any]) -> str:
            alts: list[str] = []
            rejects = ""
            for ch, child in node.items():
                if ch == "":
                    continue
                rejects += ch
                lit = class_char(ch)
                has_children = any(k != "" for k in child)
                alts.append(f"[{lit}] ({visit(child)})" if has_children else f"[{lit}] {char}+")
                if has_children and "" in child:
                    alts[-1] = f"[{lit}] ({visit(child)})"
            if alts:
                alts.append(f'[^"{"".join(class_char(c) for c in rejects)}] {char}*')
            return " | ".join(alts)

        end = "" if "" in trie else "?"
        return f'["] ( {visit(trie)} ){end} ["]'

    def _all_of(self, schema: dict[str, Any], name: str, rule_name: str, path: str, doc: Document,
                depth: int) -> str:  # fmt: skip
        parts = schema_list(schema["allOf"], "allOf", path)
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        if "properties" in rest or "required" in rest:
            parts = [*parts, {**rest, "type": "object"}]
        properties: list[tuple[str, Any]] = []
        required: set[str] = set()
        for i, part in enumerate(parts):
            part, part_doc = self._deref(part, f"{path}/allOf/{i}", doc)
            if not isinstance(part, dict) or not ("properties" in part or part.get("type") == "object"):
                if len(parts) == 1:
                    return self._visit({**rest, **part}, name, f"{path}/allOf/0", part_doc, depth + 1)
                raise SchemaRefused("allOf", path, "only objects can be combined; this part is not one.")
            properties += list(properties_of(part, f"{path}/allOf/{i}"))
            required |= required_of(part, f"{path}/allOf/{i}")
        return self.add_rule(rule_name, self._object(properties, required, None, name, path, doc, depth))

    def _deref(self, part: Any, path: str, doc: Document) -> tuple[Any, Document]:
        for _ in range(self.limits.max_depth):
            if not (isinstance(part, dict) and isinstance(part.get("$ref"), str)):
                return part, doc
            if not part["$ref"].startswith("#"):
                raise SchemaRefused("$ref", path, "remote references are never fetched.")
            part = doc.resolve(part["$ref"], path)
        raise SchemaRefused("$ref", path, "references loop.")

    def _array(self, schema: dict[str, Any], sub: str, path: str, doc: Document, depth: int) -> str:
        lo, hi = count_of(schema, "minItems", path, 0), count_of(schema, "maxItems", path, None)
        if hi is not None and lo > hi:
            raise SchemaRefused("minItems", path, f"{lo} is above maxItems {hi}.")
        prefix = schema.get(
            "prefixItems", schema.get("items") if isinstance(schema.get("items"), list) else None
        )
        if prefix is not None:
            items = schema_list(prefix, "prefixItems", path)
            if lo > len(items):
                raise SchemaRefused("minItems", path, f"{lo} is more than the {len(items)} prefixItems.")
            if hi is not None and hi < len(items):
                raise SchemaRefused("maxItems", path, f"{hi} is fewer than the {len(items)} prefixItems.")
            rules = [
                self._visit(s, f"{sub}tuple-{i}", f"{path}/prefixItems/{i}", doc, depth + 1)
                for i, s in enumerate(items)
            ]
            return '"[" space ' + ' "," space '.join(rules) + ' space "]"'
        items_schema = schema.get("items", True)
        if (items_schema is True or items_schema == {}) and lo == 0 and hi is None:
            return self.primitive("array")
        item = self._visit(items_schema, f"{sub}item", f"{path}/items", doc, depth + 1)
        where = ("minItems" if hi is None or lo > hi else "maxItems", path)
        if hi is not None and hi > self.limits.max_count:
            where = ("maxItems", path)
        elif lo > self.limits.max_count:
            where = ("minItems", path)
        body = self.repetition(item, lo, hi, '"," space', where=where)
        return f'"[" space {body} space "]"'

    def _string(self, schema: dict[str, Any], rule_name: str, path: str) -> str:
        lo, hi = count_of(schema, "minLength", path, 0), count_of(schema, "maxLength", path, None)
        fmt = schema.get("format")
        shaped = "pattern" in schema or (isinstance(fmt, str) and (fmt in FORMATS or fmt.startswith("uuid")))
        if shaped and (lo or hi is not None):
            keyword = "minLength" if lo else "maxLength"
            raise SchemaRefused(keyword, path, "cannot be enforced together with 'pattern' or 'format'.")
        if "pattern" in schema:
            source = schema["pattern"]
            if not isinstance(source, str):
                raise SchemaRefused("pattern", path, "must be a string.")
            if len(source) > self.limits.max_pattern_chars:
                raise SchemaRefused(
                    "pattern", path, f"longer than {self.limits.max_pattern_chars} characters."
                )
            try:
                body = pattern.pattern_rule(
                    source, rule_name, self.add_rule,
                    lambda item, a, b: self.repetition(item, a, b, where=("pattern", path)),
                )  # fmt: skip
            except pattern.Unsupported as exc:
                raise SchemaRefused("pattern", path, f"{source!r}: {exc}.") from None
            return self.add_rule(rule_name, body)
        if isinstance(fmt, str) and (fmt == "uuid" or re.fullmatch(r"uuid[1-5]", fmt)):
            return self.add_rule(rule_name, self.primitive("uuid"))
        if isinstance(fmt, str) and fmt in FORMATS:
            return self.add_rule(rule_name, self.primitive(FORMATS[fmt]))
        if hi is not None and lo > hi:
            raise SchemaRefused("minLength", path, f"{lo} is above maxLength {hi}.")
        if lo or hi is not None:
            where = ("maxLength" if hi is not None and hi > self.limits.max_count else "minLength", path)
            chars = self.repetition(self.primitive("char"), lo, hi, where=where)
            return self.add_rule(rule_name, f'"\\"" {chars} "\\""')
        return (
            self.add_rule(rule_name, self.primitive("string"))
            if rule_name == "root"
            else self.primitive("string")
        )
