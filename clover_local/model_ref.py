"""How a person names a model, anywhere one is named: the one grammar of every command and the app's model picker.

- a preset: ``smollm2-135m`` (or the path of a preset ``.toml``);
- a local GGUF: ``./Model-Q4_K_M.gguf``, ``~/models/x.gguf`` (the first shard of a split model);
- a Hugging Face GGUF repo, with an optional quant, as llama.cpp's ``-hf`` takes it: ``ORG/REPO[:QUANT]``;
  the same as Ollama writes it, ``hf.co/ORG/REPO[:QUANT]`` (``https://huggingface.co/...`` too), and as
  ``compare`` wrote it first, ``hf:ORG/REPO[:QUANT]``. The file is picked by llama.cpp's ``-hf`` rules
  (``fetch.quants.select_quant_files``): the quant named, else Q4_K_M, else Q8_0, else the first GGUF;
- an OpenAI-compatible endpoint, where a command takes one (``compare``): ``http://HOST:PORT/v1#MODEL``.

:func:`parse_model_ref` is pure: it reads the text only (no file, preset or network is looked at), so what a
name means is decided the same way everywhere; :mod:`clover_local.model_files` then finds what it names.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from clover_local.errors import ModelRefError

ModelRefKind = Literal["preset", "file", "hub", "endpoint"]

_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$")
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_PRESET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_HUB_HOSTS = ("hf.co/", "huggingface.co/", "www.huggingface.co/")
_PATH_STARTS = ("/", "./", "../", "~", ".\\", "..\\")
_DEFAULT_TAGS = ("latest",)
"""Ollama's word for "the default quant" (``hf.co/ORG/REPO:latest``): llama.cpp's default is meant."""

FORMS = (
    "a preset (smollm2-135m)",
    "a .gguf file (./Model-Q4_K_M.gguf)",
    "ORG/REPO[:QUANT] as llama.cpp's -hf takes it (bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)",
    "hf.co/ORG/REPO[:QUANT] as Ollama takes it",
    "hf:ORG/REPO[:QUANT]",
)
ENDPOINT_FORM = "an endpoint URL#MODEL (http://127.0.0.1:8080/v1#my-model)"


@dataclass(frozen=True)
class ModelRef:
    """A model as named, read: exactly the fields of its ``kind`` are set."""

    text: str
    """As the person wrote it (for messages and reports)."""
    kind: ModelRefKind
    preset: str | None = None
    """``preset``: the preset's name, or the path of its ``.toml``."""
    path: str | None = None
    """``file``: the GGUF's path as written (``~`` not expanded here)."""
    repo: str | None = None
    """``hub``: ``ORG/REPO``."""
    quant: str | None = None
    """``hub``: the quant asked for (matched in the repo's file names, case-insensitively, as ``-hf`` does);
    None: llama.cpp's default pick."""
    url: str | None = None
    """``endpoint``: the base URL, ending in ``/v1`` when no path was given."""
    model: str | None = None
    """``endpoint``: the model name to ask it for."""

    @property
    def hf_spec(self) -> str | None:
        """``ORG/REPO[:QUANT]``, as ``llama-server -hf`` takes it (``hub`` only)."""
        if self.repo is None:
            return None
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


def parse_model_ref(
    text: str, *, endpoints: bool = False, presets: Collection[str] | None = None
) -> ModelRef:
    """What ``text`` names, in the grammar of the module docstring; :class:`ModelRefError` listing the forms
    when it is none of them. ``endpoints``: a URL may name an endpoint (``compare``); elsewhere a URL that is
    not a Hugging Face repo is refused. ``presets``: the preset names known here, so an unknown bare name is
    refused with the forms (None: any bare name is taken for a preset, and loading it says if it is not)."""
    written = text
    text = text.strip()
    if not text:
        raise _error("An empty model name.", endpoints)
    lowered = text.lower()
    if lowered.startswith(("http://", "https://")):
        without_scheme = text.split("://", 1)[1]
        if without_scheme.lower().startswith(_HUB_HOSTS):
            return _hub(written, without_scheme.split("/", 1)[1], endpoints)
        if not endpoints:
            raise _error(f"{text!r} is an endpoint's URL; a model to run here is named otherwise.", False)
        return _endpoint(written, text)
    if lowered.startswith("hf:"):
        return _hub(written, text[3:], endpoints)
    if lowered.startswith(_HUB_HOSTS):
        return _hub(written, text.split("/", 1)[1], endpoints)
    if lowered.endswith(".toml"):
        return ModelRef(written, "preset", preset=text)
    if lowered.endswith(".gguf") or text.startswith(_PATH_STARTS) or re.match(r"^[A-Za-z]:[\\/]", text):
        return ModelRef(written, "file", path=text)
    if "/" in text:
        return _hub(written, text, endpoints)
    if not _PRESET.match(text):
        raise _error(f"{text!r} is not a model name.", endpoints)
    if presets is not None and text not in presets:
        known = ", ".join(sorted(presets)) or "none"
        raise _error(f"{text!r} is not a preset here (presets: {known}).", endpoints)
    return ModelRef(written, "preset", preset=text)


def forms_text(endpoints: bool = False) -> str:
    """The forms a model can be named in, for help texts and errors."""
    return "; ".join((*FORMS, *((ENDPOINT_FORM,) if endpoints else ())))


def _hub(written: str, spec: str, endpoints: bool) -> ModelRef:
    """``ORG/REPO[:QUANT]`` (after any ``hf:`` or ``hf.co/``); a trailing ``/`` or a web page's path
    (``/tree/main``) is not part of a repo id."""
    repo, _, quant = spec.partition(":")
    parts = repo.strip("/").split("/")
    if len(parts) > 2 and parts[2] in ("tree", "blob", "resolve"):
        parts = parts[:2]
    repo = "/".join(parts)
    if not _REPO.match(repo) or (quant and not _QUANT.match(quant)):
        raise _error(f"{written.strip()!r} is not a Hugging Face GGUF repo (ORG/REPO[:QUANT]).", endpoints)
    chosen = None if not quant or quant.lower() in _DEFAULT_TAGS else quant
    return ModelRef(written, "hub", repo=repo, quant=chosen)


def _endpoint(written: str, text: str) -> ModelRef:
    url, hash_sign, model = text.partition("#")
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ModelRefError(
            "The endpoint's URL holds a user name or password, which would be printed and saved.",
            "Put the key in an environment variable and name it with --key-env VAR.",
        )
    if not hash_sign or not model.strip():
        raise ModelRefError(
            f"The endpoint {url} names no model.",
            f"Add it after a #: {url}#MODEL (as the endpoint lists it).",
        )
    if parts.query or not parts.hostname:
        raise ModelRefError(f"{url} is not an endpoint's base URL.", "Write it as http://HOST:PORT/v1#MODEL.")
    base = url.rstrip("/")
    if not parts.path.strip("/"):
        base += "/v1"
    return ModelRef(written, "endpoint", url=base, model=model.strip())


def _error(what: str, endpoints: bool) -> ModelRefError:
    return ModelRefError(what, f"Name a model as {forms_text(endpoints)}.")
