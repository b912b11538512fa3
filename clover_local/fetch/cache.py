"""The Hugging Face cache layout, written exactly as huggingface_hub writes it, so the ``hf`` CLI,
``hf_hub_download`` and other tools see clover-local's downloads as their own (and the other way round).

    <HF_HUB_CACHE>/models--org--name/
        blobs/<etag>                      the file's bytes (etag = sha256 for LFS files)
        blobs/<etag>.incomplete           clover-local's resumable partial (kept across runs)
        snapshots/<commit>/<path>         relative symlink to ../../blobs/<etag>
        refs/<revision>                   the commit a branch or tag pointed to
    <HF_HUB_CACHE>/.locks/models--org--name/<etag>.lock   the same lock huggingface_hub takes
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path

from clover_local import settings
from clover_local.errors import DownloadError
from clover_local.user_files import current_umask, write_atomically

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_ETAG_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
"""A blob name: a git blob id (sha1) or an LFS sha256; anything else from an endpoint is refused."""
# huggingface_hub 2.x writes `<etag>.<8 hex>.incomplete`, unique per process; we adopt or remove those.
_HF_TMP_RE = re.compile(r"^(?P<etag>[^.]+)\.[0-9a-f]{8}\.incomplete$")
# huggingface_hub (and earlier clover-local versions) touch `tmp_<uuid4>` beside the blobs to read permissions.
_PROBE_RE = re.compile(r"^tmp_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
CORRUPT_SUFFIX = ".corrupt"


def repo_folder(repo: str, under: str = "") -> Path:
    """``<HF_HUB_CACHE>/<under>/models--org--name`` (``under``: ``.locks`` for the locks)."""
    return settings.hf_cache_dir() / under / ("models--" + repo.replace("/", "--"))


def check_etag(etag: str) -> str:
    """``etag`` when it can name a blob (40 or 64 lowercase hex digits); else :class:`DownloadError`.

    An ETag or a listing comes from whatever ``HF_ENDPOINT`` points at: it becomes a path part only once
    it is known to be a hash, so a hostile endpoint cannot make clover-local write outside the cache."""
    return _checked(etag, _ETAG_RE, "answered with a file id that is not a hash")


def check_commit(commit: str) -> str:
    """``commit`` when it is a 40-hex commit hash; else :class:`DownloadError` (see :func:`check_etag`)."""
    return _checked(commit, _COMMIT_RE, "named a commit that is not a commit hash")


def _checked(value: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.match(value):
        raise DownloadError(
            f"The Hub endpoint {what} ({value[:80]!r}); refusing to use it.",
            "Check HF_ENDPOINT points at the Hugging Face Hub or a faithful mirror.",
        )
    return value


def blob_path(repo: str, etag: str) -> Path:
    """``blobs/<etag>`` (``<etag>.corrupt`` names the moved-aside copy of one)."""
    check_etag(etag.removesuffix(CORRUPT_SUFFIX))
    return repo_folder(repo) / "blobs" / etag


def partial_path(repo: str, etag: str) -> Path:
    """Where clover-local keeps a resumable partial download of one blob."""
    return repo_folder(repo) / "blobs" / f"{check_etag(etag)}.incomplete"


def lock_path(repo: str, etag: str) -> Path:
    """The lock huggingface_hub takes around writing this blob; sharing it keeps both tools apart."""
    return repo_folder(repo, ".locks") / f"{check_etag(etag)}.lock"


def pointer_path(repo: str, commit: str, filename: str) -> Path:
    snapshots = repo_folder(repo) / "snapshots"
    check_commit(commit)
    path = snapshots / commit / Path(*filename.split("/"))
    if snapshots not in path.parents or ".." in filename.split("/"):
        raise ValueError(f"unsafe file name {filename!r}")
    return path


def is_commit_hash(revision: str) -> bool:
    return _COMMIT_RE.match(revision) is not None


def looks_like_sha256(text: str) -> bool:
    return _SHA256_RE.match(text) is not None


def read_ref(repo: str, revision: str) -> str | None:
    """The commit a revision resolves to in the cache (a commit hash resolves to itself)."""
    if is_commit_hash(revision):
        return revision
    ref = repo_folder(repo) / "refs" / revision
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if is_commit_hash(commit) else None


def write_ref(repo: str, revision: str, commit: str) -> None:
    """Remember which commit ``revision`` pointed to (atomically, like huggingface_hub)."""
    if revision == commit:
        return
    check_commit(commit)
    refs = repo_folder(repo) / "refs"
    ref = refs / revision
    if refs not in ref.parents or ".." in revision.split("/"):
        raise DownloadError(f"{revision!r} cannot be a revision name.", "Name a branch, tag or commit.")
    if not (ref.exists() and ref.read_text() == commit):
        write_atomically(ref, commit.encode())


def link_snapshot(repo: str, commit: str, filename: str, etag: str) -> Path:
    """Make ``snapshots/<commit>/<filename>`` point at the blob; copy where symlinks are not allowed."""
    pointer = pointer_path(repo, commit, filename)
    blob = blob_path(repo, etag)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:
        shutil.copyfile(blob, pointer)
    return pointer


def move_into_place(partial: Path, blob: Path) -> None:
    """Give the finished file the permissions a new file gets (huggingface_hub makes blobs
    readable as a new file would be, not 0600), then rename it: one atomic step, nothing else
    written, so a kill at any point leaves either the partial or the blob."""
    umask = current_umask()
    if umask is not None:
        with contextlib.suppress(OSError):
            os.chmod(partial, 0o666 & ~umask)
    os.replace(partial, blob)


def adopt_orphaned_partials(repo: str, etag: str) -> int:
    """Fold huggingface_hub's leftover ``<etag>.<uuid>.incomplete`` files into our resumable partial.

    Call with the blob's lock held: huggingface_hub writes those files only under the same lock, so
    any present now belong to a process that died (SIGKILL skips its cleanup). The longest one becomes
    our partial when it is longer than ours; the rest can never be reused and are removed.
    Returns the size of the partial afterwards.
    """
    partial = partial_path(repo, etag)
    best = partial.stat().st_size if partial.exists() else 0
    for path in hf_partials(repo, etag):
        size = path.stat().st_size
        if size > best:
            os.replace(path, partial)
            best = size
        else:
            path.unlink(missing_ok=True)
    return best


def hf_partials(repo: str, etag: str) -> list[Path]:
    """huggingface_hub's per-process temporary files of one blob."""
    blobs = repo_folder(repo) / "blobs"
    if not blobs.is_dir():
        return []
    return [p for p in blobs.iterdir() if (m := _HF_TMP_RE.match(p.name)) and m["etag"] == etag]


def remove_stale_partials(repo: str, live_etags: set[str], *, min_age_s: float = 3600.0) -> list[Path]:
    """Delete partial files that can never be finished: for blobs the repo no longer has, and
    huggingface_hub leftovers untouched for ``min_age_s`` (a live download writes every second),
    and empty permission probes that old."""
    blobs = repo_folder(repo) / "blobs"
    if not blobs.is_dir():
        return []
    removed = []
    now = time.time()
    for path in blobs.iterdir():
        if _PROBE_RE.match(path.name):
            # an empty permission probe (`tmp_<uuid>`) left by a process killed while it existed
            with contextlib.suppress(OSError):
                if not path.stat().st_size and now - path.stat().st_mtime >= min_age_s:
                    path.unlink()
                    removed.append(path)
            continue
        if not path.name.endswith(".incomplete"):
            continue
        hf_tmp = _HF_TMP_RE.match(path.name)
        etag = hf_tmp.group("etag") if hf_tmp else path.name.removesuffix(".incomplete")
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        if (etag not in live_etags or hf_tmp) and age >= min_age_s:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def quarantine_blob(repo: str, etag: str, source: Path) -> Path:
    """Move a file whose sha256 is wrong out of use (``blobs/<etag>.corrupt``) and drop every
    snapshot link to its blob, so no tool loads it and the next download fetches it fresh."""
    blob = blob_path(repo, etag)
    target = blob.with_name(etag + CORRUPT_SUFFIX)
    os.replace(source, target)
    snapshots = repo_folder(repo) / "snapshots"
    if snapshots.is_dir():
        for link in snapshots.rglob("*"):
            if link.is_symlink() and (link.parent / os.readlink(link)).resolve() == blob.resolve():
                link.unlink()
    return target


def nearest_existing_dir(path: Path) -> Path:
    """``path`` or its closest existing parent (the cache may not exist yet when disk space is checked)."""
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return candidate
    return Path(path.anchor or ".")
