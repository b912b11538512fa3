"""Fetch one blob into the Hugging Face cache so that an interrupted transfer resumes where it stopped.

huggingface_hub 2.4 writes each download to a process-unique temporary file and deletes it on failure,
so nothing survives a Ctrl-C, a network drop or a killed process. Here the bytes go to the cache's own
``blobs/<etag>.incomplete`` (kept across runs, under the same file lock huggingface_hub takes), through
huggingface_hub's HTTP session, continuing with a ``Range`` request. The sha256 is computed while the
bytes arrive (after re-reading what an earlier run left), so verifying a 38 GB file costs no extra pass.
The finished file is checked against the Hub's sha256 before it is renamed to ``blobs/<etag>``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import filelock
import httpx2
from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import get_session, hf_raise_for_status

from clover_local.errors import DownloadCancelled, DownloadError, NotEnoughDiskError, VerificationError
from clover_local.fetch import cache
from clover_local.fetch.hub import RATE_LIMIT_RETRIES, FileLocation, retry_delay_s
from clover_local.fetch.progress import ProgressTracker, format_bytes

HASH_BLOCK = 8 * 1024 * 1024
DROP_RETRY_WAIT_S = 0.5
"""Pause before continuing a transfer whose connection broke after bytes arrived."""
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}

Relocate = Callable[[], FileLocation]
"""Asks the Hub again where the file is (signed CDN URLs expire during long downloads)."""


def fetch_blob(
    repo: str,
    location: FileLocation,
    sha256: str | None,
    *,
    filename: str,
    tracker: ProgressTracker,
    index: int,
    cancel: threading.Event | None,
    relocate: Relocate,
) -> Path:
    """Make ``blobs/<etag>`` hold the file's verified bytes, resuming any partial; return its path.

    A connection that breaks after bytes arrived is continued (with a fresh URL) for as long as each
    attempt gets further; 429/503 answers wait (``Retry-After``, bounded) and retry a few times.
    """
    blob = cache.blob_path(repo, location.etag)
    if blob.exists():
        return blob
    lock = cache.lock_path(repo, location.etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with _hold_lock(lock, cancel, on_wait=lambda: tracker.start("waiting", index)):
        if blob.exists():  # another process finished it while we waited
            return blob
        partial = cache.partial_path(repo, location.etag)
        already = cache.adopt_orphaned_partials(repo, location.etag)
        if already > location.size:  # not this file's bytes (the file changed, or a foreign write)
            partial.unlink()
            already = 0
        hasher = hashlib.sha256()
        if already:
            tracker.start("checking", index)
            _hash_into(partial, hasher, tracker, cancel, limit=already)
        if already < location.size:
            tracker.start("downloading", index, already)
            with partial.open("ab", buffering=0) as f:  # unbuffered: what write() returned is on disk
                writer = _HashingWriter(f, hasher, tracker, cancel)
                _transfer_with_retries(location, writer, relocate, cancel, filename=filename, partial=partial)
            hasher = writer.hasher  # hashed on the way in: no second pass over the file
        # else: an earlier run got every byte but was stopped before the rename; asking the server
        # for `bytes=SIZE-` would only get 416, so the partial is verified and put in place as is.
        tracker.start("verifying", index)
        tracker.advance(location.size)
        # A file without an LFS sha256 (a small git file) is named by its git blob id: check that instead,
        # so no file is ever accepted unverified.
        expected = sha256 or location.etag
        digest = hasher.hexdigest() if sha256 else git_blob_oid(partial)
        if digest != expected:
            moved = cache.quarantine_blob(repo, location.etag, partial)
            kind = "sha256" if sha256 else "git blob id"
            raise VerificationError(
                f"{filename} arrived corrupt: its {kind} is {digest}, the Hub says {expected}. "
                f"The bad copy was moved aside to {moved}.",
                "Run the same command again to fetch it fresh (then delete the .corrupt file). If it fails"
                " again, a proxy or the disk is damaging data.",
            )
        cache.move_into_place(partial, blob)
    return blob


def hash_file(
    path: Path, tracker: ProgressTracker | None = None, cancel: threading.Event | None = None
) -> str:
    """sha256 of a file, reporting bytes read to ``tracker``."""
    hasher = hashlib.sha256()
    _hash_into(path, hasher, tracker, cancel, limit=None)
    return hasher.hexdigest()


def git_blob_oid(path: Path) -> str:
    """The git blob id (sha1 of ``blob <size>\\0`` and the bytes): what the Hub names a non-LFS file by."""
    hasher = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    _hash_into(path, hasher, None, None, limit=None)
    return hasher.hexdigest()


def _hash_into(
    path: Path,
    hasher: hashlib._Hash,
    tracker: ProgressTracker | None,
    cancel: threading.Event | None,
    *,
    limit: int | None,
) -> None:
    left = sys.maxsize if limit is None else limit
    with path.open("rb") as f:
        while left > 0 and (block := f.read(min(HASH_BLOCK, left))):
            _raise_if_cancelled(cancel)
            hasher.update(block)
            left -= len(block)
            if tracker is not None:
                tracker.advance(len(block))


def _transfer_with_retries(
    location: FileLocation,
    writer: _HashingWriter,
    relocate: Relocate,
    cancel: threading.Event | None,
    *,
    filename: str,
    partial: Path,
) -> None:
    rate_limited = 0
    fresh = True  # the URL was just handed out by the Hub
    while True:
        before = writer.tell()
        try:
            _transfer_once(location, writer)
            break
        except HfHubHTTPError as exc:
            delay = retry_delay_s(exc, rate_limited, RATE_LIMIT_RETRIES)
            if delay is not None:
                rate_limited += 1
                wait_with_cancel(delay, cancel)
                continue
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403, 410) and not fresh:  # an expired signed URL
                location, fresh = relocate(), True
                continue
            raise
        except httpx2.TransportError:
            if writer.tell() <= before:
                raise
            wait_with_cancel(DROP_RETRY_WAIT_S, cancel)
            location, fresh = relocate(), True
        except OSError as exc:
            raise _write_failed(exc, filename, partial, location.size) from None
        fresh = False
    if writer.tell() != location.size:
        raise DownloadError(
            f"The transfer of {filename} ended at {format_bytes(writer.tell())} of {format_bytes(location.size)}.",
            "Run the same command again: it continues from there.",
        )


def _transfer_once(location: FileLocation, writer: _HashingWriter) -> None:
    """One GET from the writer's position to the end of the file."""
    start = writer.tell()
    headers = dict(location.headers)
    if start:
        headers["Range"] = f"bytes={start}-"
    with get_session().stream(
        "GET", location.url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, follow_redirects=True
    ) as response:
        hf_raise_for_status(response)
        if start and response.status_code == 200:
            writer.restart()  # the server ignored Range and sends everything
        for chunk in response.iter_bytes():
            writer.write(chunk)


def _write_failed(exc: OSError, filename: str, partial: Path, size: int) -> DownloadError:
    saved = partial.stat().st_size if partial.exists() else 0
    if exc.errno in _DISK_FULL_ERRNOS:
        return NotEnoughDiskError(
            f"The disk filled up while downloading {filename}: {format_bytes(saved)} of "
            f"{format_bytes(size)} are saved in {partial}.",
            f"Free at least {format_bytes(size - saved)} and run the same command again: it continues from there.",
        )
    return DownloadError(
        f"Could not write {partial} ({exc.strerror or exc}); {format_bytes(saved)} of {format_bytes(size)} are saved.",
        "Check the disk and its permissions, then run the same command again.",
    )


class _HashingWriter:
    """Appends arriving bytes to the partial file, hashing and counting them; stops the transfer
    when ``cancel`` is set (the partial stays for the next run)."""

    def __init__(
        self,
        f: BinaryIO,
        hasher: hashlib._Hash,
        tracker: ProgressTracker,
        cancel: threading.Event | None,
    ) -> None:
        self._f = f
        self.hasher = hasher
        """The sha256 of the whole file so far (the resumed prefix was hashed before the transfer)."""
        self._tracker = tracker
        self._cancel = cancel

    def write(self, data: bytes) -> int:
        _raise_if_cancelled(self._cancel)
        view = memoryview(data)
        while view:
            view = view[self._f.write(view) or 0 :]
        self.hasher.update(data)
        self._tracker.advance(len(data))
        return len(data)

    def tell(self) -> int:
        return self._f.tell()

    def restart(self) -> None:
        """Drop what was written: the server sends the file from its first byte."""
        self._f.seek(0)
        self._f.truncate(0)
        self.hasher = hashlib.sha256()
        self._tracker.rewind(0)


@contextlib.contextmanager
def _hold_lock(path: Path, cancel: threading.Event | None, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold huggingface_hub's per-blob lock, waiting as long as needed but staying cancellable;
    ``on_wait`` runs once, at once, when another process holds it (so the person is told why
    nothing moves)."""
    lock = filelock.FileLock(str(path), mode=0o664)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        on_wait()
        while True:
            try:
                lock.acquire(timeout=0.5)
                break
            except filelock.Timeout:
                _raise_if_cancelled(cancel)
    try:
        yield
    finally:
        lock.release()


def _raise_if_cancelled(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise DownloadCancelled(
            "Download cancelled; what was fetched is kept.", "Run the download again to continue from there."
        )


def wait_with_cancel(seconds: float, cancel: threading.Event | None) -> None:
    """Sleep ``seconds`` (between retries), waking early to raise if ``cancel`` is set."""
    if cancel is None:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if cancel.wait(min(left, 0.5)):
            _raise_if_cancelled(cancel)
