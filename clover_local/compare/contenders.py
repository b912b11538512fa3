"""What a contender on the command line names: a preset, a local ``.gguf``, a Hugging Face GGUF repo
(``OWNER/REPO[:QUANT]``, ``hf.co/OWNER/REPO[:QUANT]`` or ``hf:OWNER/REPO[:QUANT]``) or an OpenAI-compatible
endpoint someone already runs (``URL#MODEL``), read by the one model grammar (``clover_local.model_ref``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from clover_local.errors import UsageError

ContenderKind = Literal["preset", "gguf", "hf", "endpoint"]
MAX_CONTENDERS = 8


@dataclass(frozen=True)
class Contender:
    name: str
    """As given: the report's name for it."""
    kind: ContenderKind
    target: str
    """The preset's name, the file's path, the repo, or the endpoint's base URL."""
    quant: str | None = None
    """``hf:``: the quant asked for (None: the one planned for this machine, ``openers.planned_quant``)."""
    model: str | None = None
    """An endpoint's model name."""


def parse_contender(text: str) -> Contender:
    """One contender, as the person wrote it, in the model grammar every command reads
    (:func:`clover_local.model_ref.parse_model_ref`, endpoints allowed); a :class:`UsageError` listing the forms
    otherwise."""
    from clover_local.model_ref import parse_model_ref

    ref = parse_model_ref(text, endpoints=True)
    name = text.strip()
    if ref.kind == "endpoint":
        assert ref.url is not None
        return Contender(name, "endpoint", ref.url, model=ref.model)
    if ref.kind == "hub":
        assert ref.repo is not None
        return Contender(name, "hf", ref.repo, ref.quant)
    if ref.kind == "file":
        assert ref.path is not None
        return Contender(name, "gguf", ref.path)
    assert ref.preset is not None
    return Contender(name, "preset", ref.preset)


def parse_contenders(texts: Sequence[str]) -> list[Contender]:
    """All contenders, each named once; at least one, at most :data:`MAX_CONTENDERS`."""
    if not texts:
        raise UsageError("Name the models to compare.", "clover-local compare smollm2-135m gemma3-270m")
    if len(texts) > MAX_CONTENDERS:
        raise UsageError(f"{len(texts)} contenders: at most {MAX_CONTENDERS} at once.")
    out = [parse_contender(t) for t in texts]
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"Named twice: {', '.join(twice)}.", "Name each contender once.")
    return out
