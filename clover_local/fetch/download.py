"""The download step's public API: find a quant's files, download them resumably into the Hugging Face cache
(huggingface_hub's own layout, :mod:`.cache`: shared with the ``hf`` CLI and other tools; HF_HOME, HF_HUB_CACHE,
HF_TOKEN, HF_HUB_OFFLINE and HF_ENDPOINT mean what they mean there), verify them. A local GGUF path is accepted
wherever a model is expected."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx2
from huggingface_hub.errors import HfHubHTTPError

from clover_local import settings
from clover_local.arch_support import ArchCheck
from clover_local.errors import DownloadError, HubUnreachableError, NotEnoughDiskError, VerificationError
from clover_local.fetch import cache, hub
from clover_local.fetch.local import CachedGGUF, cached_ggufs, local_gguf, looks_like_path, packaged_model
from clover_local.fetch.preflight import check_before_download
from clover_local.fetch.progress import ProgressCallback, ProgressTracker, format_bytes
from clover_local.fetch.quants import files_for_name, is_model_gguf, quant_matches, select_quant_files
from clover_local.fetch.sidecars import DraftKind, draft_sidecars, gguf_role
from clover_local.fetch.transfer import fetch_blob, hash_file
from clover_local.presets import Preset, load_preset

__all__ = [
    "CachedGGUF",
    "FileCheck",
    "RemoteFile",
    "ResolvedFiles",
    "cached_ggufs",
    "cached_model_path",
    "cached_sidecars",
    "check_architectures",
    "download_model",
    "local_gguf",
    "resolve_quant_files",
    "verify_files",
]

FreeSpace = Callable[[Path], int]


@dataclass(frozen=True)
class RemoteFile:
    path: str
    """Path in the repo."""
    size: int
    sha256: str | None
    """What the bytes must hash to (the Hub's LFS sha256); None for small non-LFS files."""
    draft: DraftKind | None = None
    """For a drafter sidecar (``mtp-``, ``dflash-``...): its kind; None for the model's own shards."""


@dataclass(frozen=True)
class ResolvedFiles:
    """The files of one quant at one commit: shards in order, the first is what llama.cpp loads, then the
    drafter sidecars chosen for it (one per kind the repo offers), as ``llama-server -hf`` would pick them."""

    repo: str
    revision: str
    commit: str
    quant: str
    files: tuple[RemoteFile, ...]
    repo_etags: frozenset[str] = frozenset()
    """Every blob the commit references; partials for other blobs can never be finished."""
    offline: bool = False
    """Resolved from the cache without asking the Hub."""
    architecture: ArchCheck | None = None
    """What :func:`check_architectures` found for the model; None before the check (or with nothing to fetch)."""
    notes: tuple[str, ...] = ()
    """From the check, for the person: sidecars skipped, what ``--force`` let through."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def local_path(self, index: int = 0) -> Path:
        """Where file ``index`` is (or will be) in the cache's snapshot folder."""
        return cache.pointer_path(self.repo, self.commit, self.files[index].path)

    @property
    def is_cached(self) -> bool:
        return all(self.local_path(i).exists() for i in range(len(self.files)))

    @property
    def model_files(self) -> tuple[RemoteFile, ...]:
        """The model's own shards, without sidecars."""
        return tuple(f for f in self.files if f.draft is None)

    @property
    def sidecars(self) -> dict[DraftKind, Path]:
        """Drafter kind -> where its sidecar is (or will be) in the cache."""
        return {f.draft: self.local_path(i) for i, f in enumerate(self.files) if f.draft is not None}


@dataclass(frozen=True)
class FileCheck:
    """The result of verifying one cached file."""

    filename: str
    path: Path
    size: int
    expected_sha256: str | None
    actual_sha256: str
    moved_to: Path | None = None
    """Where a corrupt blob was moved aside (out of use)."""
    draft: DraftKind | None = None
    """The drafter kind when the file is a sidecar (``mtp-``...), None for the model's shards."""

    @property
    def ok(self) -> bool:
        return self.expected_sha256 is None or self.actual_sha256 == self.expected_sha256


def resolve_quant_files(
    repo: str,
    quant: str | None = None,
    revision: str | None = None,
    *,
    filename: str | None = None,
    drafts: bool = True,
) -> ResolvedFiles:
    """List ``repo`` on the Hub and pick the files of ``quant`` (a pattern matched in the file names)
    or of the split that ``filename`` belongs to, plus (``drafts``) the best drafter sidecar of each kind
    the repo has for them. Offline, or with the Hub unreachable, resolves from the cache instead; raises
    :class:`DownloadError` when neither can answer."""
    if not quant and not filename:
        raise DownloadError("Say which quant (e.g. Q4_K_M) or which file to download.")
    revision = revision or "main"
    label = quant or filename or ""
    if settings.hf_offline():
        return _resolve_from_cache(repo, revision, quant, filename, drafts) or _not_cached(
            repo, label, offline=True
        )
    try:
        listing = hub.list_repo(repo, revision)
    except HubUnreachableError:
        if (cached := _resolve_from_cache(repo, revision, quant, filename, drafts)) is None:
            raise
        return cached
    entries = {e.path: e for e in listing.entries}
    paths = (
        files_for_name(repo, entries, filename)
        if filename
        else select_quant_files(repo, entries, quant or "")
    )
    files = [RemoteFile(p, entries[p].size, entries[p].sha256) for p in paths]
    if drafts:
        for kind, p in sidecars_for(list(entries), paths[0], quant).items():
            files.append(RemoteFile(p, entries[p].size, entries[p].sha256, draft=kind))
    return ResolvedFiles(
        repo=repo,
        revision=revision,
        commit=listing.commit,
        quant=label,
        files=tuple(files),
        repo_etags=frozenset(e.etag for e in listing.entries if e.etag),
    )


def sidecars_for(paths: list[str], model_path: str, quant: str | None) -> dict[DraftKind, str]:
    """The drafter sidecars that go with the model file ``model_path`` (none when it is itself a sidecar):
    llama.cpp's ranking with the quant asked for as the tag (the file's own quant for ``--file``)."""
    if gguf_role(model_path) != "model":
        return {}
    return draft_sidecars(paths, model_path, quant or "")


def download_model(
    model: str | Path | Preset,
    quant: str | None = None,
    *,
    revision: str | None = None,
    filename: str | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    free_space: FreeSpace | None = None,
    drafts: bool = True,
    force: bool = False,
) -> Path:
    """Make a model's GGUF available locally and return the path llama.cpp loads (the first shard).

    ``model`` is a preset (object or name), a repo id (``org/name``) or a local GGUF path (returned
    as is after a check). ``drafts``: also fetch the drafter sidecars the repo has for the quant.
    Before any byte of the files, their architectures are checked (:func:`check_architectures`; ``force``
    downloads what the llama.cpp here cannot load). Interrupted downloads resume; finished files are verified
    against the Hub's sha256; ``cancel`` stops between chunks (keeping what arrived); ``progress`` gets
    :class:`DownloadProgress` snapshots. ``free_space`` (bytes free at a path) is for tests.
    """
    if isinstance(model, Path) or (isinstance(model, str) and looks_like_path(model)):
        return local_gguf(model)
    if isinstance(model, Preset | str) and (packaged := packaged_model(model)) is not None:
        return packaged
    repo, quant = repo_and_quant(model, quant, filename)
    resolved = resolve_quant_files(repo, quant, revision, filename=filename, drafts=drafts)
    return fetch_resolved(resolved, progress=progress, cancel=cancel, free_space=free_space, force=force)


def check_architectures(resolved: ResolvedFiles, *, force: bool = False) -> ResolvedFiles:
    """The files checked against the llama.cpp here before any of their bytes (:mod:`.preflight`:
    :class:`ArchitectureError` unless ``force``; sidecars it cannot load left out, said in ``notes``). Nothing is
    asked when nothing is to be fetched (all cached, or offline): loading checks local files itself."""
    if resolved.architecture is not None or resolved.is_cached or resolved.offline:
        return resolved
    sidecars = {
        f.path: f.draft
        for i, f in enumerate(resolved.files)
        if f.draft is not None and not resolved.local_path(i).exists()
    }
    found = check_before_download(
        resolved.repo, resolved.commit, resolved.quant, resolved.files[0].path, sidecars, force=force
    )
    files = tuple(f for f in resolved.files if f.path not in found.skipped)
    return replace(resolved, files=files, architecture=found.architecture, notes=found.notes)


def fetch_resolved(
    resolved: ResolvedFiles,
    *,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    free_space: FreeSpace | None = None,
    force: bool = False,
) -> Path:
    """Download the files :func:`resolve_quant_files` picked (what is cached is skipped, partials
    resume), after :func:`check_architectures` (unless done already); return the local path of the first
    shard."""
    if not resolved.is_cached:
        if resolved.offline:
            _not_cached(resolved.repo, resolved.quant, offline=True)
        resolved = check_architectures(resolved, force=force)  # may leave out a sidecar
    tracker = ProgressTracker(progress, [(f.path, f.size) for f in resolved.files])
    if not resolved.is_cached:
        cache.remove_stale_partials(resolved.repo, set(resolved.repo_etags))
        missing = [i for i in range(len(resolved.files)) if not resolved.local_path(i).exists()]
        locations = {i: _locate(resolved, i) for i in missing}
        _check_disk_space(resolved, locations, free_space or _free_disk_bytes)
        for i in missing:
            # Signed CDN URLs expire: ask again for shards started after a long first one.
            location = locations[i] if i == missing[0] else _locate(resolved, i)
            _fetch(resolved, i, location, tracker, cancel)
    _refresh_ref(resolved)
    tracker.finish()
    return resolved.local_path(0)


def verify_files(
    model: str | Path | Preset,
    quant: str | None = None,
    *,
    revision: str | None = None,
    filename: str | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    drafts: bool = True,
) -> list[FileCheck]:
    """Hash a downloaded model's files (and, ``drafts``, its drafter sidecars) against the Hub's sha256
    (from the cache's blob names when offline). A corrupt blob is moved aside and unlinked from the snapshot, then
    :class:`VerificationError` says what to do. A local GGUF path is hashed and reported."""
    if isinstance(model, Path) or (isinstance(model, str) and looks_like_path(model)):
        path = local_gguf(model)
        return [FileCheck(path.name, path, path.stat().st_size, None, hash_file(path))]
    repo, quant = repo_and_quant(model, quant, filename)
    resolved = resolve_quant_files(repo, quant, revision, filename=filename, drafts=drafts)
    missing = [
        f.path
        for i, f in enumerate(resolved.files)
        if f.draft is None and not resolved.local_path(i).exists()
    ]
    if missing:
        raise DownloadError(
            f"{repo} {resolved.quant} is not fully downloaded (missing: {', '.join(missing)}).",
            "Run `clover-local download` first.",
        )
    # Sidecars not downloaded (``download --no-draft``) are not the model's: skip them.
    present = [i for i in range(len(resolved.files)) if resolved.local_path(i).exists()]
    tracker = ProgressTracker(progress, [(resolved.files[i].path, resolved.files[i].size) for i in present])
    checks: list[FileCheck] = []
    for n, i in enumerate(present):
        f = resolved.files[i]
        pointer = resolved.local_path(i)
        blob = pointer.resolve()
        tracker.start("verifying", n)
        digest = hash_file(blob, tracker, cancel)
        check = FileCheck(f.path, pointer, blob.stat().st_size, f.sha256, digest, draft=f.draft)
        if not check.ok:
            check = replace(check, moved_to=cache.quarantine_blob(repo, blob.name, blob))
        checks.append(check)
    tracker.finish()
    if bad := [c for c in checks if not c.ok]:
        lines = "; ".join(f"{c.filename} (moved aside to {c.moved_to})" for c in bad)
        raise VerificationError(
            f"{len(bad)} of {len(checks)} file(s) of {repo} {resolved.quant} are corrupt: {lines}.",
            "Run `clover-local download` again to fetch them fresh, then delete the .corrupt files.",
        )
    return checks


def cached_model_path(model: str | Preset, quant: str | None = None) -> Path | None:
    """The cached first shard of a model, without touching the network; None when not downloaded."""
    repo, quant = repo_and_quant(model, quant, None)
    resolved = _resolve_from_cache(repo, "main", quant, None, drafts=False)
    return resolved.local_path(0) if resolved else None


def cached_sidecars(model: str | Preset, quant: str | None = None) -> dict[DraftKind, Path]:
    """The drafter sidecars downloaded for a model's quant (kind -> path), without touching the network."""
    repo, quant = repo_and_quant(model, quant, None)
    resolved = _resolve_from_cache(repo, "main", quant, None, drafts=True)
    return resolved.sidecars if resolved else {}


def repo_and_quant(model: str | Preset, quant: str | None, filename: str | None) -> tuple[str, str | None]:
    """The repo id and the file-name pattern to match, from a preset (object or name) or a repo id."""
    if isinstance(model, str) and "/" in model:
        return model, quant
    preset = model if isinstance(model, Preset) else load_preset(model)
    if filename:
        return preset.repo, None
    name = quant if quant and quant != "auto" else fallback_quant(preset)
    spec = preset.quants.get(name)
    return preset.repo, spec.pattern if spec else name


def fallback_quant(preset: Preset) -> str:
    """The preset's default quant, or its first listed one when the default is ``auto``."""
    return preset.default_quant if preset.default_quant != "auto" else next(iter(preset.quants))


def _resolve_from_cache(
    repo: str, revision: str, quant: str | None, filename: str | None, drafts: bool = True
) -> ResolvedFiles | None:
    """The quant's files as the cache holds them (snapshot of the commit ``revision`` last pointed to)."""
    commit = cache.read_ref(repo, revision)
    snapshot = cache.repo_folder(repo) / "snapshots" / (commit or "")
    if commit is None or not snapshot.is_dir():
        return None
    present = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]
    if filename:
        if filename not in present:
            return None
        paths = files_for_name(repo, present, filename)
    else:
        if quant and not any(quant_matches(p, quant) for p in present if is_model_gguf(p)):
            return None  # no quant given: the file `-hf REPO` loads, if it is here
        try:
            paths = select_quant_files(repo, present, quant or "")
        except DownloadError:
            return None  # e.g. a split with shards not downloaded yet
    kinds: dict[str, DraftKind | None] = dict.fromkeys(paths)
    if drafts:
        kinds |= {p: kind for kind, p in sidecars_for(present, paths[0], quant).items()}
    files = []
    for p, kind in kinds.items():
        blob = (snapshot / p).resolve()
        sha = blob.name if cache.looks_like_sha256(blob.name) else None
        files.append(RemoteFile(p, blob.stat().st_size, sha, draft=kind))
    return ResolvedFiles(repo, revision, commit, quant or filename or "", tuple(files), offline=True)


def _not_cached(repo: str, label: str, *, offline: bool) -> ResolvedFiles:
    raise HubUnreachableError(
        f"{repo} {label} is not in the Hugging Face cache ({settings.hf_cache_dir()}), and "
        + ("offline mode is on (HF_HUB_OFFLINE=1)." if offline else "the Hub cannot be reached."),
        "Connect to the internet (and unset HF_HUB_OFFLINE) to download it, or pick a model you already"
        " have: `clover-local models`.",
    )


def _locate(resolved: ResolvedFiles, index: int) -> hub.FileLocation:
    location = hub.locate_file(resolved.repo, resolved.commit, resolved.files[index].path)
    expected = resolved.files[index]
    if location.size != expected.size:
        raise DownloadError(
            f"The Hub lists {expected.path} as {expected.size} bytes but serves {location.size}.",
            "The repo may be changing right now; try again in a few minutes.",
        )
    # The ETag names the blob on disk: it must be the hash the listing gave (the LFS sha256, or for a small
    # file one of the commit's git blob ids, which the transfer then checks against the bytes).
    listed = location.etag == expected.sha256 if expected.sha256 else location.etag in resolved.repo_etags
    if not listed:
        raise DownloadError(
            f"The Hub's ETag for {expected.path} ({location.etag}) is not the hash its listing gives.",
            "The repo may be changing right now; try again in a few minutes. If it persists, check HF_ENDPOINT.",
        )
    return location


def _fetch(
    resolved: ResolvedFiles,
    index: int,
    location: hub.FileLocation,
    tracker: ProgressTracker,
    cancel: threading.Event | None,
) -> None:
    """Fetch one file into the cache and link it into the snapshot; failures say what was kept."""
    f = resolved.files[index]
    try:
        fetch_blob(
            resolved.repo,
            location,
            f.sha256,
            filename=f.path,
            tracker=tracker,
            index=index,
            cancel=cancel,
            relocate=lambda: _locate(resolved, index),
        )
    except (httpx2.TransportError, HfHubHTTPError, HubUnreachableError) as exc:
        what = f"download {f.path}"
        err = exc if isinstance(exc, DownloadError) else hub.hub_error(exc, repo=resolved.repo, what=what)
        partial = cache.partial_path(resolved.repo, location.etag)
        if partial.exists() and partial.stat().st_size:
            kept = format_bytes(partial.stat().st_size)
            err = type(err)(
                f"{err.what} ({kept} of {format_bytes(f.size)} saved; the next run continues from there)",
                err.fix,
            )
        raise err from None
    cache.link_snapshot(resolved.repo, resolved.commit, f.path, location.etag)


def _refresh_ref(resolved: ResolvedFiles) -> None:
    if not resolved.offline:
        cache.write_ref(resolved.repo, resolved.revision, resolved.commit)


def _check_disk_space(
    resolved: ResolvedFiles, locations: dict[int, hub.FileLocation], free_space: FreeSpace
) -> None:
    """Refuse to start unless the disk holds what is still to download plus a margin."""
    remaining = 0
    for i, loc in locations.items():
        if cache.blob_path(resolved.repo, loc.etag).exists():
            continue
        partial = cache.partial_path(resolved.repo, loc.etag)
        have = partial.stat().st_size if partial.exists() else 0
        remaining += max(resolved.files[i].size - have, 0)
    if not remaining:
        return
    margin = disk_margin(remaining)
    where = cache.nearest_existing_dir(cache.repo_folder(resolved.repo))
    free = free_space(where)
    if free < remaining + margin:
        raise NotEnoughDiskError(
            f"Not enough disk space for {resolved.repo} {resolved.quant}: {format_bytes(remaining)} still to"
            f" download (plus {format_bytes(margin)} to spare), but only {format_bytes(free)} free on {where}.",
            f"Free {format_bytes(remaining + margin - free)}, or point HF_HUB_CACHE (or HF_HOME) at a disk"
            " with more room.",
        )


def disk_margin(remaining: int) -> int:
    """Room to keep free besides the download: 1% of it plus 256 MB (logs, the OS, other writers)."""
    return remaining // 100 + 256 * 1000 * 1000


def _free_disk_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free
