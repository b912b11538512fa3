"""Model files and their sidecars in a GGUF repo, told apart and paired by llama.cpp's own rules.

A GGUF repo may hold, beside the model's quants, files that are not models: a vision projector
(``mmproj``), an importance matrix (``imatrix``), and draft heads for self-speculative decoding: a
multi-token-prediction head (``mtp-``), an EAGLE-3 drafter (``eagle3-``), a DFlash or DSpark block drafter
(``dflash-``, ``dspark-``). llama.cpp's ``-hf`` path (``common/download.cpp`` at the pinned commit) decides
which is which by the file name (``gguf_filename_is_model``) and picks a sidecar for a model with
``find_best_sibling`` (:func:`best_sibling` says how).

This module is that logic in Python, pure (no I/O), so that clover-local downloads what ``llama-server -hf``
would, and names the same sidecar on its command line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from clover_local.gguf.names import DRAFT_KINDS, SHARD_RE, DraftKind

__all__ = [
    "DRAFT_KINDS",
    "DraftKind",
    "FileRole",
    "best_sibling",
    "draft_kind_of",
    "draft_sidecars",
    "gguf_role",
]

FileRole = Literal["model", "mmproj", "imatrix", "mtp", "eagle3", "dflash", "dspark"]

_KEYWORDS: dict[FileRole, str] = {
    "mmproj": "mmproj",
    "imatrix": "imatrix",
    "mtp": "mtp-",
    "eagle3": "eagle3-",
    "dflash": "dflash-",
    "dspark": "dspark-",
}
"""Substrings of the file name (case-sensitive, as in llama.cpp) that make a GGUF a sidecar."""

_TAG_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


def gguf_role(path: str) -> FileRole | None:
    """What a repo file is: ``model``, a sidecar kind, or None when it is not a GGUF at all.

    llama.cpp's ``gguf_filename_is_model``: the name (not the folders) is searched for each of
    :data:`_KEYWORDS`; a ``.gguf`` without any is a model."""
    if not path.endswith(".gguf"):
        return None
    name = path.rsplit("/", 1)[-1]
    for role, keyword in _KEYWORDS.items():
        if keyword in name:
            return role
    return "model"


@dataclass(frozen=True)
class SplitInfo:
    """``get_gguf_split_info``: the path without ``.gguf`` and split suffix, its trailing tag, shard numbers."""

    prefix: str
    tag: str
    index: int
    count: int


def split_info(path: str) -> SplitInfo:
    """llama.cpp's reading of a GGUF path: ``dir/m-Q4_K_M-00001-of-00002.gguf`` -> prefix ``dir/m-Q4_K_M``,
    tag ``Q4_K_M``, shard 1 of 2. A path not ending in ``.gguf`` has an empty tag and is 0 of 0."""
    if not path.endswith(".gguf"):
        return SplitInfo("", "", 0, 0)
    prefix, index, count = path.removesuffix(".gguf"), 1, 1
    if m := SHARD_RE.match(path):
        prefix, index, count = m["base"], int(m["index"]), int(m["count"])
    t = _TAG_RE.search(prefix)
    return SplitInfo(prefix, t.group(1).upper() if t else "", index, count)


def quant_bits(tag: str) -> int:
    """``Q4_K_M`` -> 4, ``F16`` -> 16, ``IQ2_XXS`` -> 2: the number starting at the tag's first digit; 0 if none."""
    m = re.search(r"\d+", tag)
    return int(m.group(0)) if m else 0


def best_sibling(paths: Iterable[str], model: str, keyword: str, tag: str = "") -> str | None:
    """``find_best_sibling``: the GGUF among ``paths`` whose path holds ``keyword`` and that belongs with
    ``model`` (a repo path), or None.

    Candidates sit in the model's folder or a folder above it; the deepest folder wins, then a name
    carrying ``-TAG.`` exactly (when ``tag``, the quant asked for, is given), then the nearest bit width
    (to ``tag``'s, else to the model file's own tag). Ties keep the first in listing order."""
    tag_upper = tag.upper()
    model_bits = quant_bits(tag_upper) if tag_upper else quant_bits(split_info(model).tag)
    model_dirs = model.split("/")[:-1]
    best: str | None = None
    best_key: tuple[int, bool, int] | None = None
    for path in paths:
        if not path.endswith(".gguf") or keyword not in path:
            continue
        dirs = path.split("/")[:-1]
        if len(dirs) > len(model_dirs) or model_dirs[: len(dirs)] != dirs:
            continue
        diff = abs(quant_bits(split_info(path).tag) - model_bits)
        key = (len(dirs), bool(tag_upper) and f"-{tag_upper}." in path.upper(), -diff)
        if best_key is None or key > best_key:
            best, best_key = path, key
    return best


def draft_sidecars(
    paths: Iterable[str], model: str, tag: str = "", kinds: Iterable[DraftKind] = DRAFT_KINDS
) -> dict[DraftKind, str]:
    """The best drafter sidecar of each kind the repo offers for ``model`` (kind -> repo path)."""
    listed = list(paths)
    found = {kind: best_sibling(listed, model, _KEYWORDS[kind], tag) for kind in kinds}
    return {kind: path for kind, path in found.items() if path is not None}


def draft_kind_of(path: str) -> DraftKind | None:
    """The drafter kind a file name says (``mtp-X.gguf`` -> ``mtp``), None for models and other sidecars."""
    role = gguf_role(path)
    return role if role in DRAFT_KINDS else None  # type: ignore[return-value]
