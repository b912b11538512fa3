"""Fetch one release file into ``<folder>/<name>``, resuming a ``<name>.part`` an earlier run left, and verify
its sha256 against the release's digest before it is used.

The sha256 is computed while the bytes arrive (after re-reading what an earlier run left), as the Hub downloads
do (:mod:`clover_local.fetch.transfer`), and progress goes through the same :class:`ProgressTracker`. A file
whose digest does not match is deleted, part and all: nothing unverified is ever unpacked. A file the server
publishes no digest for (the source tarball) is refused unless the caller allows it; its sha256 is then returned
so the manifest records what was built.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx2

from clover_local.errors import InstallCancelled, RuntimeInstallError
from clover_local.fetch.progress import ProgressTracker, format_bytes
from clover_local.runtimes import net
from clover_local.runtimes.releases import is_file_name

MAX_ARCHIVE_BYTES = 4 * 1024**3
"""The largest release archive accepted (upstream's ROCm and CUDA archives are a few hundred MB)."""
DROP_RETRIES = 5
"""How many times a transfer whose connection broke is continued, while each attempt gets further."""
PART_SUFFIX = ".part"
_BLOCK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """A file to fetch: where, what to call it, and what it must be."""

    name: str
    url: str
    size: int | None
    """Announced size (the API's); None when unknown (the source tarball)."""
    sha256: str | None
    """Expected sha256 hex; None when the server publishes none."""


def fetch_verified(
    item: RemoteFile,
    folder: Path,
    *,
    tracker: ProgressTracker,
    index: int,
    http: httpx2.Client,
    allow_unverified: bool = False,
    max_bytes: int = MAX_ARCHIVE_BYTES,
    cancel: threading.Event | None = None,
) -> tuple[Path, str]:
    """``folder/<name>`` holding the file's verified bytes, and their sha256."""
    if not is_file_name(item.name):
        raise RuntimeInstallError(f"{item.name!r} cannot be a file name; refusing to download it.")
    if item.sha256 is None and not allow_unverified:
        raise RuntimeInstallError(
            f"{item.name} has no sha256 digest in the release, so its bytes cannot be checked.",
            "Pass --allow-unverified to install it anyway (its sha256 is recorded in the manifest), or pick"
            " another release.",
        )
    if item.size is not None and item.size > max_bytes:
        raise RuntimeInstallError(
            f"{item.name} is {format_bytes(item.size)}, more than the {format_bytes(max_bytes)} a runtime archive"
            " may be; refusing it."
        )
    folder.mkdir(parents=True, exist_ok=True)
    done, partial = folder / item.name, folder / (item.name + PART_SUFFIX)
    if done.is_file():  # verified by an earlier run that stopped before installing; checked again
        tracker.start("checking", index)
        digest = _sha256_of(done, tracker, cancel).hexdigest()
        if item.sha256 is None or digest == item.sha256:
            return done, digest
        done.unlink()
    _check_disk(folder, item, partial)
    hasher = hashlib.sha256()
    already = partial.stat().st_size if partial.exists() else 0
    if item.size is not None and already > item.size:
        partial.unlink()
        already = 0
    if already:
        tracker.start("checking", index)
        hasher = _sha256_of(partial, tracker, cancel)
    tracker.start("downloading", index, already)
    limit = item.size if item.size is not None else max_bytes
    with partial.open("ab", buffering=0) as f:
        writer = _Writer(f, hasher, tracker, cancel, limit=limit, name=item.name)
        _transfer(item, writer, http)
        hasher, got = writer.hasher, writer.tell()
    if item.size is not None and got != item.size:
        raise RuntimeInstallError(
            f"The transfer of {item.name} ended at {format_bytes(got)} of {format_bytes(item.size)}.",
            "Run the same command again: it continues from there.",
        )
    tracker.start("verifying", index)
    digest = hasher.hexdigest()
    if item.sha256 is not None and digest != item.sha256:
        partial.unlink(missing_ok=True)
        raise RuntimeInstallError(
            f"{item.name} arrived corrupt: its sha256 is {digest}, the release says {item.sha256}. It was deleted"
            " and nothing was installed.",
            "Run the same command again to fetch it fresh; if it fails again, a proxy or the mirror is altering it.",
        )
    partial.replace(done)
    return done, digest


def _transfer(item: RemoteFile, writer: _Writer, http: httpx2.Client) -> None:
    """GET from the writer's position to the end, continuing after dropped connections that made progress."""
    drops = 0
    while True:
        before = writer.tell()
        try:
            _transfer_once(item, writer, http)
            return
        except httpx2.TransportError as exc:
            drops += 1
            if writer.tell() <= before or drops > DROP_RETRIES:
                raise net.network_error(exc, item.url, what=f"download {item.name}") from None


def _transfer_once(item: RemoteFile, writer: _Writer, http: httpx2.Client) -> None:
    start = writer.tell()
    extra = {"Range": f"bytes={start}-"} if start else None
    with net.open_stream(http, item.url, what=f"download {item.name}", extra=extra) as response:
        if response.status_code == 416:
            if item.size is not None and start == item.size:
                return  # every byte arrived before an earlier run stopped
            writer.restart()  # the part is longer than what the server has: not this file's bytes
            _transfer_once(item, writer, http)
            return
        if start and response.status_code != 206:
            writer.restart()  # the server ignored the Range and sends the whole file
        for chunk in response.iter_bytes():  # as they arrive: a drop keeps what came
            writer.write(chunk)


def _sha256_of(path: Path, tracker: ProgressTracker, cancel: threading.Event | None) -> hashlib._Hash:
    hasher = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 * _BLOCK):
            check_cancelled(cancel)
            hasher.update(block)
            tracker.advance(len(block))
    return hasher


def _check_disk(folder: Path, item: RemoteFile, partial: Path) -> None:
    if item.size is None:
        return
    have = partial.stat().st_size if partial.exists() else 0
    free = shutil.disk_usage(folder).free
    # The archive, then about three times its size unpacked beside it.
    need = (item.size - have) + 3 * item.size
    if free < need:
        raise RuntimeInstallError(
            f"Not enough disk space in {folder} for {item.name}: {format_bytes(free)} free, about"
            f" {format_bytes(need)} needed (the archive and its unpacked files).",
            "Free some space (or point CLOVER_RUNTIMES_DIR at a larger disk) and run the same command again.",
        )


def check_cancelled(cancel: threading.Event | None) -> None:
    """Raise :class:`InstallCancelled` once ``cancel`` is set: between the steps of an install, and for each
    block a transfer or a hash reads."""
    if cancel is not None and cancel.is_set():
        raise InstallCancelled()


class _Writer:
    """Appends arriving bytes to the part file, hashing and counting them, refusing more than ``limit``."""

    def __init__(
        self,
        f: BinaryIO,
        hasher: hashlib._Hash,
        tracker: ProgressTracker,
        cancel: threading.Event | None,
        *,
        limit: int,
        name: str,
    ) -> None:
        self._f = f
        self.hasher = hasher
        self._tracker = tracker
        self._cancel = cancel
        self._limit = limit
        self._name = name

    def write(self, data: bytes) -> None:
        check_cancelled(self._cancel)
        if self.tell() + len(data) > self._limit:
            raise RuntimeInstallError(
                f"The server sent more than {format_bytes(self._limit)} for {self._name}; refusing it.",
                "Check CLOVER_LLAMACPP_RELEASES points at GitHub or a faithful mirror.",
            )
        view = memoryview(data)
        while view:
            view = view[self._f.write(view) or 0 :]
        self.hasher.update(data)
        self._tracker.advance(len(data))

    def tell(self) -> int:
        return int(self._f.tell())

    def restart(self) -> None:
        self._f.seek(0)
        self._f.truncate(0)
        self.hasher = hashlib.sha256()
        self._tracker.rewind(0)
