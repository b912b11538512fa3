"""Integers and numbers with bounds and ``multipleOf``. Integers follow llama.cpp (digit-wise ranges,
:mod:`.intrange`); llama.cpp leaves a number's bounds unchecked, so here a bounded number is an integer in
range or a decimal ``k.f`` whose whole open interval ``(k, k+1)`` is in range (no exponent): every value
written is inside the bounds, exactly for integer bounds and a little inside a fractional one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from clover_local.engine.schema_gbnf.intrange import INT64_MAX, INT64_MIN, min_max_int
from clover_local.engine.schema_gbnf.limits import SchemaRefused

Primitive = Callable[[str], str]
"""Adds a builtin rule (``integer``, ``number``) to the grammar and returns its name."""

_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def number_rule(primitive: Primitive, max_enum: int, schema: dict[str, Any], kind: str, path: str) -> str:
    """The GBNF body for an ``integer`` or ``number`` schema."""
    lo, lo_excl, hi, hi_excl = bounds(schema, path)
    step = schema.get("multipleOf")
    fraction_digits: int | None = None
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int | float) or step <= 0:
            raise SchemaRefused("multipleOf", path, "must be a number above 0.")
        if float(step).is_integer():
            kind = "integer"
        else:
            fraction_digits = _decimal_places(step)
            if kind == "integer" or fraction_digits is None:
                raise SchemaRefused(
                    "multipleOf", path, f"{step} is not enforced (only whole numbers and 0.1, 0.01, ...)."
                )
    first, last = whole_range(lo, lo_excl, hi, hi_excl)
    if kind == "integer":
        return _integers(
            primitive, max_enum, first, last, int(step) if step is not None and int(step) > 1 else 1, path
        )
    if lo is None and hi is None and fraction_digits is None:
        return primitive("number")
    alternatives = []
    if first is None or last is None or first <= last:
        alternatives.append(_integers(primitive, max_enum, first, last, 1, path))
    digits = "[0-9]{0,14} [1-9]" if fraction_digits is None else _fraction(fraction_digits)
    # k.f lies in (k, k+1); -k.f in (-k-1, -k).
    pos = _range(max(0, math.ceil(lo)) if lo is not None else 0, None if hi is None else math.floor(hi) - 1)
    neg = _range(max(0, math.ceil(-hi)) if hi is not None else 0, None if lo is None else math.floor(-lo) - 1)
    if pos is not None:
        alternatives.append(f'({pos}) "." {digits}')
    if neg is not None:
        alternatives.append(f'"-" ({neg}) "." {digits}')
    if not alternatives:
        raise SchemaRefused(
            "minimum" if lo is not None else "maximum", path, "no number is inside these bounds."
        )
    return " | ".join(f"({a})" for a in alternatives)


def bounds(schema: dict[str, Any], path: str) -> tuple[float | None, bool, float | None, bool]:
    """(lower bound, exclusive?, upper bound, exclusive?); a bound that is not a finite number is refused."""
    lo, lo_excl = _bound(schema, "minimum", "exclusiveMinimum", path)
    hi, hi_excl = _bound(schema, "maximum", "exclusiveMaximum", path)
    return lo, lo_excl, hi, hi_excl


def whole_range(
    lo: float | None, lo_excl: bool, hi: float | None, hi_excl: bool
) -> tuple[int | None, int | None]:
    """The first and last integer inside the bounds (None: unbounded on that side)."""
    first = (
        None if lo is None else (math.floor(lo) + 1 if lo_excl and float(lo).is_integer() else math.ceil(lo))
    )
    last = (
        None if hi is None else (math.ceil(hi) - 1 if hi_excl and float(hi).is_integer() else math.floor(hi))
    )
    return first, last


def _integers(
    primitive: Primitive, max_enum: int, first: int | None, last: int | None, step: int, path: str
) -> str:
    if first is not None and last is not None and first > last:
        raise SchemaRefused("minimum", path, f"no integer is inside these bounds ({first} > {last}).")
    if step > 1:
        if first is None or last is None:
            raise SchemaRefused("multipleOf", path, "is enforced only between a minimum and a maximum.")
        start = -(-first // step) * step
        values = list(range(start, last + 1, step)) if (last - start) // step < max_enum else None
        if values is None:
            raise SchemaRefused("multipleOf", path, f"more than {max_enum} multiples in range.")
        if not values:
            raise SchemaRefused("multipleOf", path, "no multiple is inside the bounds.")
        return "(" + " | ".join(f'"{v}"' for v in values) + ")"
    if first is None and last is None:
        return primitive("integer")
    for value, keyword in ((first, "minimum"), (last, "maximum")):
        if value is not None and not INT64_MIN < value < INT64_MAX:
            raise SchemaRefused(keyword, path, "is outside the 64-bit integers the grammar handles.")
    return "(" + min_max_int(first, last) + ")"


def _range(first: int, last: int | None) -> str | None:
    """Digits of a whole part ``k >= 0`` in ``[first, last]``; None when empty."""
    if last is not None and first > last:
        return None
    if first == 0 and last is None:
        return "[0] | [1-9] [0-9]{0,15}"
    return min_max_int(first, last)


def _fraction(places: int) -> str:
    return "[1-9]" if places == 1 else f"[0-9]{{0,{places - 1}}} [1-9]"


def _decimal_places(step: float) -> int | None:
    """d when ``step`` is 10**-d (0.1, 0.01, ...), else None."""
    for places in range(1, 16):
        if math.isclose(step, 10.0**-places, rel_tol=1e-9):
            return places
    return None


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, path: str) -> tuple[float | None, bool]:
    """The bound on one side and whether it is exclusive (draft-4 boolean ``exclusive*`` included)."""
    inc, exc = schema.get(inclusive), schema.get(exclusive)
    if isinstance(exc, bool):
        return (_number(inc, inclusive, path), exc) if inc is not None else (None, False)
    values = [(v, k == exclusive) for v, k in ((inc, inclusive), (exc, exclusive)) if v is not None]
    if not values:
        return None, False
    checked = [(_number(v, exclusive if e else inclusive, path), e) for v, e in values]
    lower = inclusive == "minimum"
    # both given: the tighter one wins
    return max(checked) if lower else min(checked, key=lambda b: (b[0], not b[1]))


def _number(value: Any, keyword: str, path: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SchemaRefused(keyword, path, "must be a finite number.")
    if abs(value) >= 2**62:
        raise SchemaRefused(keyword, path, "is outside the 64-bit integers the grammar handles.")
    return float(value) if isinstance(value, float) else int(value)


__all__ = ["INT64_MAX", "bounds", "number_rule", "whole_range"]
