"""What a contender on the command line names: a preset, a local ``.gguf``, a Hugging Face GGUF repo
(``hf:OWNER/REPO[:QUANT]``) or an OpenAI-compatible endpoint someone already runs (``URL#MODEL``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from clover_local.errors import UsageError

ContenderKind = Literal["preset", "gguf", "hf", "endpoint"]
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_QUANT = re.compile(r"^[A-Za-z0-9_.\-]{1,40}$")
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

    @property
    def local(self) -> bool:
        return self.kind != "endpoint"


def parse_contender(text: str) -> Contender:
    """One contender, as the person wrote it; a :class:`UsageError` saying what was meant otherwise."""
    text = text.strip()
    if not text:
        raise UsageError("An empty contender.", "Give a preset, a .gguf, hf:OWNER/REPO[:QUANT] or URL#MODEL.")
    if text.startswith(("http://", "https://")):
        return _endpoint(text)
    if text.startswith("hf:"):
        repo, _, quant = text[3:].partition(":")
        if not _REPO.match(repo) or (quant and not _QUANT.match(quant)):
            raise UsageError(
                f"{text!r} is not a Hugging Face GGUF repo.", "Write hf:OWNER/REPO or hf:OWNER/REPO:Q4_K_M."
            )
        return Contender(text, "hf", repo, quant or None)
    if text.endswith(".gguf") or "/" in text or text.startswith((".", "~")):
        return Contender(text, "gguf", text)
    return Contender(text, "preset", text)


def _endpoint(text: str) -> Contender:
    url, hash_sign, model = text.partition("#")
    parts = urlsplit(url)
    if not hash_sign or not model.strip():
        raise UsageError(
            f"The endpoint {url} names no model.",
            f"Add it after a #: {url}#MODEL (as the endpoint lists it).",
        )
    if parts.username or parts.password:
        raise UsageError(
            "The endpoint's URL holds a user name or password, which would be printed and saved.",
            "Put the key in an environment variable and name it with --key-env VAR.",
        )
    if parts.query or not parts.hostname:
        raise UsageError(f"{url} is not an endpoint's base URL.", "Write it as http://HOST:PORT/v1#MODEL.")
    base = url.rstrip("/")
    if not parts.path.strip("/"):
        base += "/v1"
    return Contender(text, "endpoint", base, model=model.strip())


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
