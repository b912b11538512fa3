"""The schema walk: llama.cpp's ``common_chat_schema_builder`` and ``common_chat_schema_converter`` in one
pass over the JSON, with the bounds of :mod:`.limits` checked before text is written. Each schema given to
:meth:`Converter.visit_document` is its own document: its ``$ref``s resolve against it, wherever its rule is
used (a tool's parameters inside a call object keep their references)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

from clover_local.engine.schema_gbnf import branches, exclusive, numbers, pattern, regex_facts
from clover_local.engine.schema_gbnf.common import (
    INVALID_RULE_CHARS,
    Document,
    build_repetition,
    constant,
    count_of,
    existing,
    pointer,
    repetition_cost,
    schema_list,
)
from clover_local.engine.schema_gbnf.finite import endless
from clover_local.engine.schema_gbnf.keywords import (
    beside,
    listed_values,
    name_matches,
    refuse_unenforceable,
    with_constraints,
)
from clover_local.engine.schema_gbnf.limits import LIMITS, Limits, SchemaRefused, Unsatisfiable
from clover_local.engine.schema_gbnf.merge import (
    ANNOTATIONS,
    NOT_IN,
    allows_everything,
    allows_nothing,
    lift,
    merge,
)
from clover_local.engine.schema_gbnf.objects import ExtraKeys, not_strings_rule, plan_object
from clover_local.engine.schema_gbnf.rules import FORMATS, RESERVED_NAMES, SPACE_RULE, builtin

_IMPLIED_TYPES = (
    (
        "object",
        ("properties", "patternProperties", "propertyNames", "required", "minProperties", "maxProperties"),
    ),
    ("array", ("items", "prefixItems", "minItems", "maxItems", "uniqueItems")),
    ("string", ("pattern", "minLength", "maxLength", "format")),
    ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")),
)
"""The type a schema without ``type`` is written as, by the first keyword it has (``additionalProperties`` other
than true: an object)."""
_NO_VALUE = "No JSON value matches the whole schema, so no reply could ever be valid: change the schema where it says."


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
        self._ref_paths: dict[str, str] = {}
        """Rule name of each reference followed, and the place it points at (where an endless rule is named)."""
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
        """``build_repetition``, after charging what llama.cpp's parser writes out for it; a count above what
        its parser reads (2,000) is written as nested repetitions, exact."""
        keyword, path = where
        self._expanded += repetition_cost(lo, hi, self.limits.max_count) * (3 if sep else 1)
        if self._expanded > self.limits.max_expanded:
            raise SchemaRefused(
                keyword, path, f"the repetitions add up to over {self.limits.max_expanded} grammar elements."
            )
        return build_repetition(item, lo, hi, sep, limit=self.limits.max_count)

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
        try:
            rule = self._visit(schema, name, "#", doc, 0)
            self._check_finite()
            return rule
        except SchemaRefused as refused:
            place = existing(doc.root, refused.path)
            if isinstance(refused, Unsatisfiable) and refused.fix is None:
                refused = Unsatisfiable(refused.keyword, refused.path, refused.detail, _NO_VALUE)
            raise (refused if place == refused.path else refused.at(place)) from None

    def _check_finite(self) -> None:
        """Refuse a schema no finite value matches (:mod:`.finite`): its reply could never end."""
        if stuck := endless(self._rules):
            where = sorted(self._ref_paths[n] for n in stuck if n in self._ref_paths)
            raise SchemaRefused(
                "$ref" if where else "required", where[0] if where else "#",
                "every value would have to hold itself (a required property refers back to its own schema): "
                "no finite JSON matches, so no reply could end.",
            )  # fmt: skip

    def _visit(self, schema: Any, name: str, path: str, doc: Document, depth: int) -> str:
        if depth > self.limits.max_depth:
            raise SchemaRefused("$", path, f"schemas nest deeper than {self.limits.max_depth}.")
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        if schema is True or schema == {}:
            return self.add_rule(rule_name, self.primitive("value"))
        if not isinstance(schema, dict):
            raise SchemaRefused("$", path, "a schema must be an object (or true); false allows no value.")
        refuse_unenforceable(schema, path)
        schema = lift(schema)
        if "$ref" in schema:
            # Keywords beside a reference hold too (2019-09 on; before, a subset of what the schema allows).
            beside_ref = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
            return self.add_rule(rule_name, self._ref(schema["$ref"], beside_ref, path, doc, depth))
        if "allOf" in schema:
            return self._visit(self._merge_parts(schema, path, doc), name, path, doc, depth + 1)
        if branches.conditional(schema):
            cases = branches.expand(schema, doc, path)
            if len(cases) == 1:
                return self._visit(cases[0], name, path, doc, depth + 1)
            sub = name + ("-" if name else "case-")
            return self.add_rule(
                rule_name, self._alternatives([(i, c, path) for i, c in enumerate(cases)], sub, doc, depth)
            )
        for key in ("oneOf", "anyOf"):
            if key in schema:
                constraints = beside(schema)
                sub = name + ("-" if name else "alternative-")
                alternatives = [
                    (i, alt)
                    for i, a in enumerate(schema_list(schema[key], key, path))
                    if not allows_nothing(alt := with_constraints(a, constraints, pointer(path, key, i)))
                ]  # an alternative no value matches is never written (nor kept apart from the others)
                if not alternatives:
                    raise Unsatisfiable(key, path, "no alternative can match (with the keywords beside it).")
                if key == "oneOf" and len(alternatives) > 1:
                    kept = exclusive.exclusive([a for _i, a in alternatives], doc, path)
                    alternatives = [(alternatives[k][0], a) for k, a in kept]
                cases = [(i, alt, pointer(path, key, i)) for i, alt in alternatives]
                return self.add_rule(rule_name, self._alternatives(cases, sub, doc, depth))
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise SchemaRefused("type", path, "must not be empty.")
            rules = [
                self._visit({**schema, "type": t}, f"{name}-{t}" if name else str(t), path, doc, depth + 1)
                for t in dict.fromkeys(kind)
            ]
            return self.add_rule(rule_name, " | ".join(rules))
        if "const" in schema or "enum" in schema:
            values = listed_values(schema, path, self.limits.max_enum)
            return self.add_rule(rule_name, "(" + " | ".join(constant(v) for v in values) + ")")
        if kind is not None and not isinstance(kind, str):
            raise SchemaRefused("type", path, "must be a string or an array of strings.")
        if kind is None:
            implied = [t for t, keys in _IMPLIED_TYPES if any(k in schema for k in keys)]
            if schema.get("additionalProperties", True) is not True:
                implied.insert(0, "object")
            if not implied:
                return self.add_rule(rule_name, self.primitive("value"))
            kind = implied[0]
        return self._typed(schema, kind, name, rule_name, path, doc, depth)

    def _alternatives(self, cases: list[tuple[int, Any, str]], sub: str, doc: Document, depth: int) -> str:
        """``a | b | ...`` of the cases (number, schema, path); a case no value matches is never written."""
        rules: list[str] = []
        first: Unsatisfiable | None = None
        for i, case, where in cases:
            try:
                rules.append(self._visit(case, f"{sub}{i}", where, doc, depth + 1))
            except Unsatisfiable as exc:
                first = first or exc
        if not rules:
            assert first is not None
            raise first
        return " | ".join(dict.fromkeys(rules))

    def _typed(self, schema: dict[str, Any], kind: str, name: str, rule_name: str, path: str, doc: Document,
               depth: int) -> str:  # fmt: skip
        if kind == "object":
            return self.add_rule(rule_name, self._object(schema, name, path, doc, depth))
        if kind == "array":
            return self.add_rule(rule_name, self._array(schema, name + "-" if name else "", path, doc, depth))
        if kind == "string":
            return self._string(schema, rule_name, path)
        if kind in ("integer", "number"):
            body = numbers.number_rule(self.primitive, self.limits.max_enum, schema, kind, path)
            return self.add_rule(rule_name, body)
        if kind in ("boolean", "null"):
            return (
                self.primitive(kind) if rule_name != "root" else self.add_rule("root", builtin(kind).content)
            )
        raise SchemaRefused("type", path, f"unrecognized type {kind!r}.")

    def _ref(self, ref: Any, beside_ref: dict[str, Any], path: str, doc: Document, depth: int) -> str:
        """A reference's rule. With keywords beside it, one rule per reference and keywords, so a recursive schema
        written this way becomes a recursive rule (not an endless merge)."""
        target, at = doc.locate(ref, path)
        ref_name = "ref" + doc.prefix + INVALID_RULE_CHARS.sub("-", at[1:])
        key = doc.prefix + at
        if beside_ref:
            text = json.dumps(beside_ref, sort_keys=True, default=str)
            digest = hashlib.sha1(text.encode()).hexdigest()[:8]
            ref_name, key = f"{ref_name}-{digest}", f"{key}+{digest}"
            target, at = {"allOf": [{"$ref": ref}, beside_ref]}, path
        if ref_name not in self._rules and key not in self._resolving:
            self._resolving.add(key)
            if not beside_ref:
                self._ref_paths[ref_name] = at
            try:
                ref_name = self._visit(target, ref_name, at, doc, depth + 1)
            finally:
                self._resolving.discard(key)
        return ref_name

    def _merge_parts(self, schema: dict[str, Any], path: str, doc: Document) -> Any:
        """``allOf`` (and a ``$ref`` with keywords beside it) as one schema (:mod:`.merge`)."""
        merged: Any = True
        for part, where in self._parts(schema, path, doc, 0):
            merged = merge(merged, part, where)
            if merged is False:
                raise Unsatisfiable("allOf", path, "no value matches every part.")
        return merged

    def _parts(self, schema: Any, path: str, doc: Document, depth: int) -> Iterator[tuple[Any, str]]:
        """The parts of ``schema``'s ``allOf`` and ``$ref``, followed, each with the path it is at."""
        if depth > self.limits.max_depth:
            raise SchemaRefused("$ref", path, "references and 'allOf' loop or nest too deep.")
        if not isinstance(schema, dict):
            yield schema, path
            return
        rest = {k: v for k, v in schema.items() if k not in ("$ref", "allOf")}
        if "$ref" in schema:
            target, at = doc.locate(schema["$ref"], path)
            yield from self._parts(target, at, doc, depth + 1)
        if "allOf" in schema:
            for i, part in enumerate(schema_list(schema["allOf"], "allOf", path)):
                yield from self._parts(part, pointer(path, "allOf", i), doc, depth + 1)
        refuse_unenforceable(rest, path)
        yield rest, path

    def _object(self, schema: dict[str, Any], name: str, path: str, doc: Document, depth: int) -> str:
        sub = name + "-" if name else ""
        plan = plan_object(schema, path, lambda n, s: name_matches(n, branches.resolved(s, doc, path)))
        kv: dict[str, str] = {}
        for prop, prop_schema, prop_path in plan.properties:
            try:
                rule = self._visit(prop_schema, sub + prop, prop_path, doc, depth + 1)
            except Unsatisfiable:
                if prop in plan.required:
                    raise
                continue  # an optional property no value matches is never written
            kv[prop] = self.add_rule(f"{sub}{prop}-kv", f'{constant(prop)} space ":" space {rule}')
        required_props = [p for p, _s, _w in plan.properties if p in plan.required]
        optional_props = [p for p, _s, _w in plan.properties if p not in plan.required and p in kv]
        extras = [
            r
            for i, extra in enumerate(plan.extras)
            if (r := self._extra(extra, f"{sub}extra{i}", doc, depth))
        ]
        if plan.min_extras and not extras:
            raise SchemaRefused("minProperties", path, "more properties than can be written.")
        if extras:
            if not kv and not plan.min_extras and extras == ['string ":" space value']:
                return self.primitive("object")
            kv["*"] = self.add_rule(f"{sub}additional-kv", " | ".join(extras))
            if plan.min_extras:
                kv["+"] = f'{kv["*"]} ( "," space {kv["*"]} )*'
                required_props.append("+")
            else:
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

    def _extra(self, extra: ExtraKeys, name: str, doc: Document, depth: int) -> str | None:
        """``key ":" space value`` for keys beyond the declared ones; None when no such key is written (a key
        pattern the grammar cannot express: those keys are left out)."""
        if extra.pattern is not None:
            try:
                key = self._string({"type": "string", "pattern": extra.pattern}, f"{name}-k", extra.path)
            except SchemaRefused:
                return None
        elif extra.names is not None:
            key = self._visit({**branches.resolved(extra.names, doc, extra.path), "type": "string"}, f"{name}-k",
                              extra.path, doc, depth + 1)  # fmt: skip
        elif extra.excluded:
            key = self.add_rule(f"{name}-k", self._not_strings(list(extra.excluded)))
        else:
            key = self.primitive("string")
        if allows_everything(extra.value):
            return f'{key} ":" space {self.primitive("value")}'
        try:
            value = self._visit(extra.value, f"{name}-value", extra.path, doc, depth + 1)
        except Unsatisfiable:
            return None  # no value matches: no such key is written
        return f'{key} ":" space {value}'

    def _not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of ``strings`` (:func:`.objects.not_strings_rule`)."""
        return not_strings_rule(strings, self.add_rule("key-char", f"[^{pattern.UNSAFE}]"))

    def _array(self, schema: dict[str, Any], sub: str, path: str, doc: Document, depth: int) -> str:
        lo, hi = count_of(schema, "minItems", path, 0), count_of(schema, "maxItems", path, None)
        if hi is not None and lo > hi:
            raise SchemaRefused("minItems", path, f"{lo} is above maxItems {hi}.")
        prefix = schema.get(
            "prefixItems", schema.get("items") if isinstance(schema.get("items"), list) else None
        )
        if prefix is not None:
            key = "prefixItems" if "prefixItems" in schema else "items"
            items = schema_list(prefix, key, path)
            if lo > len(items):
                raise SchemaRefused("minItems", path, f"{lo} is more than the {len(items)} prefixItems.")
            if hi is not None and hi < len(items):
                raise SchemaRefused("maxItems", path, f"{hi} is fewer than the {len(items)} prefixItems.")
            rules = [
                self._visit(s, f"{sub}tuple-{i}", pointer(path, key, i), doc, depth + 1)
                for i, s in enumerate(items)
            ]
            if schema.get("uniqueItems") is True and len(items) > 1:
                raise SchemaRefused("uniqueItems", path, "the items of a tuple cannot be kept apart.")
            return '"[" space ' + ' "," space '.join(rules) + ' space "]"'
        items_schema = schema.get("items", True)
        if schema.get("uniqueItems") is True:
            return self._unique_items(items_schema, lo, hi, sub, path, doc, depth)
        if (items_schema is True or items_schema == {}) and lo == 0 and hi is None:
            return self.primitive("array")
        try:
            item = self._visit(items_schema, f"{sub}item", pointer(path, "items"), doc, depth + 1)
        except Unsatisfiable:
            if lo:
                raise
            return '"[" space "]"'  # no item can be written: only the empty array
        body = self.repetition(
            item, lo, hi, '"," space', where=("minItems" if hi is None else "maxItems", path)
        )
        return f'"[" space {body} space "]"'

    def _unique_items(self, items_schema: Any, lo: int, hi: int | None, sub: str, path: str, doc: Document,
                      depth: int) -> str:  # fmt: skip
        """``uniqueItems``: items whose values are listed are written each at most once, in the listed order;
        any other items at most one (two items the grammar writes apart could still be equal)."""
        values = branches.finite(branches.resolved(items_schema, doc, path))
        if isinstance(values, list):
            values = listed_values({"enum": values}, path, self.limits.max_enum)
            if lo <= 1 and (hi is None or hi >= len(values)):
                rules = [self.add_rule(f"{sub}unique-{i}", constant(v)) for i, v in enumerate(values)]

                def rest(i: int) -> str:
                    """What may follow the value ``rules[i]``: each later value at most once, in order."""
                    if i + 1 == len(rules):
                        return ""
                    later = f'( "," space {rules[i + 1]} )?{rest(i + 1)}'
                    return " " + self.add_rule(f"{sub}unique-rest-{i + 1}", later)

                body = "(" + " | ".join(r + rest(i) for i, r in enumerate(rules)) + ")" + ("" if lo else "?")
                return f'"[" space {body} space "]"'
        if lo > 1:
            raise SchemaRefused("uniqueItems", path, f"{lo} items that must all differ cannot be enforced "
                                "(items with listed values can).")  # fmt: skip
        item = self._visit(items_schema, f"{sub}item", pointer(path, "items"), doc, depth + 1)
        return f'"[" space {item}{"" if lo else "?"} space "]"'

    def _string(self, schema: dict[str, Any], rule_name: str, path: str) -> str:
        lo, hi = count_of(schema, "minLength", path, 0), count_of(schema, "maxLength", path, None)
        if hi is not None and lo > hi:
            raise SchemaRefused("minLength", path, f"{lo} is above maxLength {hi}.")
        fmt = schema.get("format")
        if NOT_IN in schema:
            if lo or hi is not None or "pattern" in schema or fmt is not None:
                raise SchemaRefused(
                    "not", path, "values cannot be excluded beside a length, pattern or format."
                )
            return self.add_rule(rule_name, self._not_strings(list(schema[NOT_IN])))
        if "pattern" in schema:
            source = schema["pattern"]
            if not isinstance(source, str):
                raise SchemaRefused("pattern", path, "must be a string.")
            if len(source) > self.limits.max_pattern_chars:
                raise SchemaRefused(
                    "pattern", path, f"longer than {self.limits.max_pattern_chars} characters."
                )
            try:
                if lo or hi is not None:
                    source = regex_facts.within_lengths(source, lo, hi)
                body = pattern.pattern_rule(
                    source, rule_name, self.add_rule,
                    lambda item, a, b: self.repetition(item, a, b, where=("pattern", path)),
                )  # fmt: skip
            except regex_facts.Unsupported as exc:
                if exc.keyword is None:
                    raise SchemaRefused("pattern", path, f"{source!r}: {exc}.") from None
                raise SchemaRefused(
                    exc.keyword, path, f"cannot be enforced together with 'pattern': {exc}."
                ) from None
            return self.add_rule(rule_name, body)
        if isinstance(fmt, str) and (fmt == "uuid" or re.fullmatch(r"uuid[1-5]", fmt)):
            fmt = "uuid"
        if isinstance(fmt, str) and fmt in FORMATS:
            rule, shortest, longest = FORMATS[fmt]
            if shortest < lo or (hi is not None and longest > hi):
                keyword = "minLength" if shortest < lo else "maxLength"
                raise SchemaRefused(keyword, path, f"cannot be enforced together with 'format': {fmt} values run "
                                    f"from {shortest} to {longest} characters.")  # fmt: skip
            return self.add_rule(rule_name, self.primitive(rule))
        if lo or hi is not None:
            where = ("maxLength" if hi is not None else "minLength", path)
            chars = self.repetition(self.primitive("char"), lo, hi, where=where)
            return self.add_rule(rule_name, f'"\\"" {chars} "\\""')
        return (
            self.add_rule(rule_name, self.primitive("string"))
            if rule_name == "root"
            else self.primitive("string")
        )
