"""Digit-wise GBNF for an integer range, one-sided or both: a port of ``build_min_max_int`` in llama.cpp's
``common/json-schema-to-grammar.cpp`` (the pinned llama-cpp-python 0.3.36 sdist's vendored copy). The rule
grows with the number of digits of the bounds, never with the width of the range: no value is enumerated.
"""

from __future__ import annotations

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def min_max_int(min_value: int | None, max_value: int | None) -> str:
    """A GBNF expression (no rule name) for the decimal integers in ``[min_value, max_value]``; None: unbounded
    on that side. At least one bound must be given (and both within int64, as in llama.cpp)."""
    out: list[str] = []
    _build(INT64_MIN if min_value is None else min_value, INT64_MAX if max_value is None else max_value, out)
    return "".join(out)


def _digit_range(out: list[str], lo: str, hi: str) -> None:
    out.append(f"[{lo}]" if lo == hi else f"[{lo}-{hi}]")


def _more_digits(out: list[str], min_digits: int, max_digits: int) -> None:
    out.append("[0-9]")
    if min_digits == max_digits == 1:
        return
    out.append("{" + str(min_digits))
    if max_digits != min_digits:
        out.append(",")
        if max_digits != INT64_MAX:
            out.append(str(max_digits))
    out.append("}")


def _uniform_range(out: list[str], start: str, end: str) -> None:
    i = 0
    while i < len(start) and i < len(end) and start[i] == end[i]:
        i += 1
    if i > 0:
        out.append(f'"{start[:i]}"')
    if i < len(start) and i < len(end):
        if i > 0:
            out.append(" ")
        sub_len = len(start) - i - 1
        if sub_len > 0:
            from_sub, to_sub = start[i + 1 :], end[i + 1 :]
            sub_zeros, sub_nines = "0" * sub_len, "9" * sub_len
            to_reached = False
            out.append("(")
            if from_sub == sub_zeros:
                _digit_range(out, start[i], chr(ord(end[i]) - 1))
                out.append(" ")
                _more_digits(out, sub_len, sub_len)
            else:
                out.append(f"[{start[i]}] (")
                _uniform_range(out, from_sub, sub_nines)
                out.append(")")
                if ord(start[i]) < ord(end[i]) - 1:
                    out.append(" | ")
                    if to_sub == sub_nines:
                        _digit_range(out, chr(ord(start[i]) + 1), end[i])
                        to_reached = True
                    else:
                        _digit_range(out, chr(ord(start[i]) + 1), chr(ord(end[i]) - 1))
                    out.append(" ")
                    _more_digits(out, sub_len, sub_len)
            if not to_reached:
                out.append(" | ")
                _digit_range(out, end[i], end[i])
                out.append(" ")
                _uniform_range(out, sub_zeros, to_sub)
            out.append(")")
        else:
            out.append(f"[{start[i]}-{end[i]}]")


def _build(
    min_value: int, max_value: int, out: list[str], decimals_left: int = 16, top_level: bool = True
) -> None:
    has_min, has_max = min_value != INT64_MIN, max_value != INT64_MAX

    if has_min and has_max:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            _build(-max_value, -min_value, out, decimals_left, True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            _build(0, -min_value, out, decimals_left, True)
            out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            _uniform_range(out, min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        _uniform_range(out, min_s, max_s)
        return

    less_decimals = max(decimals_left - 1, 1)

    if has_min:
        if min_value < 0:
            out.append('"-" (')
            _build(INT64_MIN, -min_value, out, decimals_left, False)
            out.append(") | [0] | [1-9] ")
            _more_digits(out, 0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                _more_digits(out, 0, less_decimals)
            else:
                _more_digits(out, 1, decimals_left)
        elif min_value <= 9:
            c = str(min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                _digit_range(out, range_start, chr(ord(c) - 1))
                out.append(" ")
                _more_digits(out, 1, less_decimals)
                out.append(" | ")
            _digit_range(out, c, "9")
            out.append(" ")
            _more_digits(out, 0, less_decimals)
        else:
            min_s = str(min_value)
            length, c = len(min_s), min_s[0]
            if c > "1":
                _digit_range(out, "1" if top_level else "0", chr(ord(c) - 1))
                out.append(" ")
                _more_digits(out, length, less_decimals)
                out.append(" | ")
            _digit_range(out, c, c)
            out.append(" (")
            _build(int(min_s[1:]), INT64_MAX, out, less_decimals, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                _digit_range(out, chr(ord(c) + 1), "9")
                out.append(" ")
                _more_digits(out, length - 1, less_decimals)
        return

    if has_max:
        if max_value >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                _more_digits(out, 0, less_decimals)
                out.append(" | ")
            _build(0, max_value, out, decimals_left, True)
        else:
            # A whole number after the sign: no leading zero ("-01" is not JSON; llama.cpp writes it).
            out.append('"-" (')
            _build(-max_value, INT64_MAX, out, decimals_left, True)
            out.append(")")
        return

    raise ValueError("At least one of min_value or max_value must be set")
