"""The quality order of llama.cpp's quant types, best first: how a smaller quant is chosen among several that fit.

From llama.cpp's own table (``tools/quantize/quantize.cpp``, ``QUANT_OPTIONS``, at the pinned commit): the K and
legacy types in the order of the perplexity each adds there (``+0.0026 ppl @ Llama-3-8B`` for Q8_0 ...
``+3.5199`` for Q2_K); the IQ, TQ and MXFP4 types, which it gives only as bits per weight, each right after the
K-quants with more bits per weight than its own (Q4_K_M's 4.56 by its size there, IQ4_NL's 4.50, Q4_K_S's 4.35
...). Names files carry beyond llama.cpp's (``Q3_K_XL``, Unsloth's dynamic mixes) rank just above the best
listed type of their family (``Q3_K_XL`` above ``Q3_K_L``); any other name (``APEX-I-NanoPlus``) is not ranked.
"""

from __future__ import annotations

import re

__all__ = ["QUALITY_ORDER", "quality_rank"]

QUALITY_ORDER: tuple[str, ...] = (
    "F32",
    "BF16",
    "F16",
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_1",
    "Q5_0",
    "Q4_K_M",
    "IQ4_NL",
    "Q4_K_S",
    "IQ4_XS",
    "MXFP4_MOE",
    "Q4_1",
    "Q4_0",
    "Q3_K_L",
    "Q3_K_M",
    "IQ3_M",
    "IQ3_S",
    "Q3_K_S",
    "IQ3_XS",
    "IQ3_XXS",
    "Q2_K_S",
    "Q2_K",
    "IQ2_M",
    "IQ2_S",
    "IQ2_XS",
    "Q2_0",
    "IQ2_XXS",
    "TQ2_0",
    "IQ1_M",
    "TQ1_0",
    "IQ1_S",
    "Q1_0",
)
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
_XL = re.compile(r"^(Q\d_K)_XL$")


def quality_rank(quant: str) -> float | None:
    """Where ``quant`` (a name as files carry it, any case) stands in :data:`QUALITY_ORDER`: 0 is the best; a
    ``Qn_K_XL`` half a step above its family's best listed type; None for a name that is not a quant type."""
    name = quant.upper().removeprefix("UD-")
    name = _ALIASES.get(name, name)
    if name in QUALITY_ORDER:
        return float(QUALITY_ORDER.index(name))
    xl = _XL.match(name)
    if xl is not None:
        family = [i for i, q in enumerate(QUALITY_ORDER) if q.startswith(xl.group(1) + "_")]
        if family:
            return min(family) - 0.5
    return None
