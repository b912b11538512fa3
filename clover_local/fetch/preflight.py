"""Before a download: can the installed llama.cpp load this model at all?

Reads the remote GGUF header (a few range requests, cached by ETag) and checks its ``general.architecture``
against the installed llama.cpp's architecture list (:mod:`clover_local.arch_support`), so an unsupported
architecture is reported before gigabytes are fetched, with what to do.
"""

from __future__ import annotations

from clover_local.arch_support import Preflight, installed_support, preflight
from clover_local.errors import DownloadError, GGUFError


def preflight_remote(repo: str, filename: str, revision: str | None, label: str) -> Preflight | None:
    """Check the architecture of ``repo/filename``; raises :class:`UsageError` when it cannot be loaded.

    None when there is nothing to check against (no llama-arch.cpp installed) or the header could not be
    read (the download itself then reports the Hub's error, or the file turns out not to be a GGUF)."""
    from clover_local.fetch.remote_header import read_remote_header

    support = installed_support()
    if support is None:
        return None
    try:
        description = read_remote_header(repo, filename, revision)
    except (GGUFError, DownloadError):
        return None
    return preflight(description.architecture.arch, f"{repo} {label}", support)
