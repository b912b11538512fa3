"""Before a download: can the llama.cpp here load this model, and each drafter sidecar that goes with it? Each
file's ``general.architecture`` (:func:`.remote_header.read_remote_architecture`: a few kilobytes of it, not the
gigabytes) is checked against the installed llama.cpp's architecture tables (:mod:`clover_local.arch_support`),
and the refusal says what to do. A header that cannot be read is refused too: unchecked does not mean allowed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from clover_local.arch_support import (
    ArchCheck,
    ArchSupport,
    check_architecture,
    installed_support,
    require_supported,
    sidecar_skipped,
    unreadable,
)
from clover_local.errors import GGUFError
from clover_local.gguf.names import DraftKind


@dataclass(frozen=True)
class DownloadCheck:
    """What the architecture check says about one quant's files."""

    architecture: ArchCheck
    """The model's (its first shard's header)."""
    skipped: frozenset[str]
    """Sidecars (repo paths) not to download: llama.cpp here cannot load them."""
    notes: tuple[str, ...]
    """For the person: each sidecar skipped, or what ``force`` let through."""


def check_before_download(
    repo: str,
    revision: str,
    label: str,
    model_file: str,
    sidecars: Mapping[str, DraftKind],
    *,
    force: bool = False,
) -> DownloadCheck:
    """Check the model file (``model_file``, any shard) and the drafter ``sidecars`` (repo path -> kind) of
    ``repo`` at ``revision``; ``label`` names the quant in messages.

    Raises :class:`ArchitectureError` when the model cannot be loaded, unless ``force``; a sidecar that cannot
    be loaded is skipped with a note (with ``force``, downloaded anyway). Hub errors propagate as
    :class:`DownloadError`: the download would meet them too."""
    support = installed_support()
    subject = f"{repo} {label}"
    model = require_supported(
        _check_remote(repo, model_file, revision, support), subject, "download", force=force
    )
    notes = [] if model.supported else [f"--force: downloading {subject} anyway: {model.why}."]
    skipped: set[str] = set()
    for path, kind in sidecars.items():
        check = _check_remote(repo, path, revision, support)
        if check.supported:
            continue
        if force:
            notes.append(f"--force: downloading the {kind} sidecar {path} anyway: {check.why}.")
        else:
            skipped.add(path)
            notes.append(sidecar_skipped(kind, path, check, "download"))
    return DownloadCheck(model, frozenset(skipped), tuple(notes))


def _check_remote(repo: str, filename: str, revision: str, support: ArchSupport) -> ArchCheck:
    from clover_local.fetch.remote_header import read_remote_architecture

    try:
        arch = read_remote_architecture(repo, filename, revision)
    except GGUFError as exc:
        return unreadable(exc.what)
    return check_architecture(arch, support)
