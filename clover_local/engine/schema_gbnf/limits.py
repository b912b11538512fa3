"""What one schema may cost the grammar, and the refusal that names the keyword and path going over."""

from __future__ import annotations

from dataclasses import dataclass

from clover_local.errors import RequestRefused


@dataclass(frozen=True)
class Limits:
    """Bounds checked before any rule text is written, so a small hostile schema costs milliseconds."""

    max_count: int = 2000
    """One ``{m,n}`` as written in the grammar. llama.cpp's grammar parser refuses a larger minimum
    (``MAX_REPETITION_THRESHOLD`` in ``llama-grammar.cpp``) and reads a larger maximum as no maximum at all, so a
    larger ``minItems``/``maxItems``/``minLength``/``maxLength`` or pattern count is written as nested
    repetitions of at most this many."""
    max_expanded: int = 100_000
    """Grammar elements once llama.cpp writes every ``{m,n}`` out (its parser copies each repetition). A bound
    past 2,000 costs about 4,000 more a factor of 2,000 (``maxLength: 32767`` about 8,000)."""
    max_depth: int = 64
    """Schema nesting (references followed)."""
    max_rules: int = 4096
    max_grammar_chars: int = 1_000_000
    max_pattern_chars: int = 1000
    max_enum: int = 4096
    """Values of one ``enum`` (or values a small ``multipleOf`` range is written as)."""


LIMITS = Limits()


class SchemaRefused(RequestRefused):
    """A schema the grammar cannot enforce exactly, or one over a limit: names the keyword and its JSON path."""

    def __init__(self, keyword: str, path: str, what: str, fix: str | None = None) -> None:
        super().__init__(f"JSON schema '{keyword}' at {path}: {what}", fix)
        self.keyword = keyword
        self.path = path
        self.detail = what

    def at(self, path: str) -> SchemaRefused:
        """The same refusal, at ``path``."""
        return type(self)(self.keyword, path, self.detail, self.fix)


class Unsatisfiable(SchemaRefused):
    """A subschema no value can match (an ``enum`` of the wrong type, parts of ``allOf`` that never meet). An
    optional property or an alternative like it is left out; where a value is needed, it is refused."""
