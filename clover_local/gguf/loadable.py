"""Whether a runtime's loader would take a GGUF, from its tensor table alone (pure: no file, no process).

Community mixes are written by many tools, and a file llama.cpp refuses costs a 12-37 GB download before anyone
finds out: the plan reads the header (a few MB) and offers no file whose tensors its runtime cannot load.

Two things decide it:

- **The types.** A tensor type the loader's ggml does not know (a fork's own type, or one llama.cpp removed,
  such as ``Q4_0_4_4``) stops the load. The header parser already refuses ids outside the ``gguf`` package's
  ``GGMLQuantizationType`` (:mod:`clover_local.gguf.parse`); this checks the parsed names against the types
  a given loader knows.
- **An expert's gate and up.** Mainline llama.cpp keeps each layer's routed-expert gate (``ffn_gate_exps``) and
  up (``ffn_up_exps``) as two tensors, so they may differ in type: it loads and decodes such a file
  (``tests/test_loadable.py`` loads one with the pinned llama.cpp, on Clover's backbone ``qwen35moe``). A loader
  that fuses the two into one matrix at load needs them in one type: a Clover mix whose gate and up differ was
  reported to need a fix before one fork loaded it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gguf

from clover_local.gguf.model import ModelDescription

__all__ = ["MAINLINE", "Loader", "load_problem"]


def _known_types() -> frozenset[str]:
    return frozenset(t.name for t in gguf.GGMLQuantizationType)


@dataclass(frozen=True)
class Loader:
    """What one runtime's loader takes."""

    name: str
    fuses_gate_up: bool = False
    """It fuses each layer's expert gate and up into one matrix at load: both must then share one type."""
    types: frozenset[str] = field(default_factory=_known_types)
    """The ggml type names it loads."""


MAINLINE = Loader("llama.cpp")
"""Mainline llama.cpp (the pinned one and the upstream releases clover-local installs): the ggml types of the
``gguf`` package it ships, gate and up loaded as two tensors."""


def load_problem(desc: ModelDescription, loader: Loader = MAINLINE) -> str | None:
    """Why ``loader`` would not load the file ``desc`` describes, in words; None when its tensor table holds
    nothing it refuses (or when no header was read: sizes estimated, nothing to check yet)."""
    if desc.tensors is None:
        return None
    unknown = sorted({t.ggml_type for t in desc.tensors if t.ggml_type and t.ggml_type not in loader.types})
    if unknown:
        return f"it holds tensors of type {', '.join(unknown)}, which {loader.name} does not load"
    if loader.fuses_gate_up:
        mixed = {il: pair for il, pair in _gate_up_types(desc).items() if pair[0] != pair[1]}
        if mixed:
            first, (gate, up) = next(iter(mixed.items()))
            return (
                f"its experts' gate and up differ in type in {len(mixed)} layers (layer {first}: gate {gate}, "
                f"up {up}), and {loader.name} fuses them into one matrix at load"
            )
    return None


def _gate_up_types(desc: ModelDescription) -> dict[int, tuple[str, str]]:
    """Per layer holding both: the types of its routed experts' gate and up."""
    gate: dict[int, str] = {}
    up: dict[int, str] = {}
    for t in desc.tensors or ():
        if t.layer is None:
            continue
        if t.name.endswith(".ffn_gate_exps.weight"):
            gate[t.layer] = t.ggml_type
        elif t.name.endswith(".ffn_up_exps.weight"):
            up[t.layer] = t.ggml_type
    return {il: (gate[il], up[il]) for il in sorted(gate.keys() & up.keys())}
