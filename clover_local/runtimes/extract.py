"""Unpack a release archive (.tar.gz or .zip) into a folder without letting any member land outside it.

Refused, with the member named: paths with ``..``, absolute paths, drive letters or backslashes; symbolic links
whose target leaves the folder (or is absolute); hard links to anything but a file unpacked before; device,
FIFO and other special members; any member placed beneath a symbolic link; more members or more bytes than the
caps (a zip bomb). Bytes are counted as they are written, not as the archive claims. Executable bits are kept,
other permission bits are not (files are 0644 or 0755).

When every member sits under one top folder (upstream's ``llama-<tag>/``), that folder is stripped, so the main
archive and the CUDA runtime archive unpack side by side.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from clover_local.errors import RuntimeInstallError
from clover_local.fetch.progress import format_bytes

MAX_MEMBERS = 20_000
MAX_UNPACKED_BYTES = 16 * 1024**3
_BLOCK = 1 << 20

Kind = Literal["file", "dir", "symlink", "hardlink", "special"]


@dataclass(frozen=True)
class _Member:
    name: str
    kind: Kind
    mode: int
    link: str = ""
    ref: object = None
    """The tarfile.TarInfo or zipfile.ZipInfo to read the bytes from."""


Opener = Callable[[_Member], IO[bytes]]


def extract_archive(
    archive: Path,
    into: Path,
    *,
    max_members: int = MAX_MEMBERS,
    max_bytes: int = MAX_UNPACKED_BYTES,
) -> None:
    """Unpack ``archive`` into the folder ``into`` (created), refusing anything unsafe (see the module doc)."""
    into.mkdir(parents=True, exist_ok=True)
    name = archive.name
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                members = list(_zip_members(zf))
                _unpack(members, into, name, max_members, max_bytes, lambda m: _zip_open(zf, m))
        elif name.endswith((".tar.gz", ".tgz", ".tar")):
            with tarfile.open(archive) as tf:
                members = list(_tar_members(tf))
                _unpack(members, into, name, max_members, max_bytes, lambda m: _tar_open(tf, m))
        else:
            raise RuntimeInstallError(f"{name} is neither a .tar.gz nor a .zip archive; cannot unpack it.")
    except (tarfile.TarError, zipfile.BadZipFile, gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise RuntimeInstallError(
            f"{name} is not a readable archive ({type(exc).__name__}: {exc})."
        ) from None
    except OSError as exc:
        raise RuntimeInstallError(f"Could not unpack {name} into {into}: {exc}.") from None


def _tar_members(tf: tarfile.TarFile) -> Iterator[_Member]:
    for info in tf:
        if info.isfile():
            yield _Member(info.name, "file", info.mode, ref=info)
        elif info.isdir():
            yield _Member(info.name, "dir", info.mode)
        elif info.issym():
            yield _Member(info.name, "symlink", info.mode, info.linkname)
        elif info.islnk():
            yield _Member(info.name, "hardlink", info.mode, info.linkname)
        else:
            yield _Member(info.name, "special", info.mode)


def _tar_open(tf: tarfile.TarFile, member: _Member) -> IO[bytes]:
    assert isinstance(member.ref, tarfile.TarInfo)
    f = tf.extractfile(member.ref)
    if f is None:
        raise RuntimeInstallError(f"Could not read {member.name} from the archive.")
    return f


def _zip_open(zf: zipfile.ZipFile, member: _Member) -> IO[bytes]:
    assert isinstance(member.ref, zipfile.ZipInfo)
    return zf.open(member.ref)


def _zip_members(zf: zipfile.ZipFile) -> Iterator[_Member]:
    for info in zf.infolist():
        mode = (info.external_attr >> 16) & 0xFFFF
        kind = stat.S_IFMT(mode)
        if info.is_dir():
            yield _Member(info.filename, "dir", mode)
        elif kind == stat.S_IFLNK:
            link = zf.read(info, pwd=None)[:4096].decode("utf-8", errors="replace")
            yield _Member(info.filename, "symlink", mode, link)
        elif kind in (0, stat.S_IFREG):
            yield _Member(info.filename, "file", mode or 0o644, ref=info)
        else:
            yield _Member(info.filename, "special", mode)


def _unpack(
    members: list[_Member],
    into: Path,
    archive: str,
    max_members: int,
    max_bytes: int,
    open_member: Opener,
) -> None:
    if len(members) > max_members:
        raise _refused(archive, f"it has {len(members)} members, more than the {max_members} allowed")
    paths = [_safe_path(m.name, archive) for m in members]
    top = _single_top(paths, members)
    root = into.resolve()
    written: set[str] = set()
    total = 0
    for member, parts in zip(members, paths, strict=True):
        if top is not None:
            parts = parts[1:]
        if not parts:
            continue
        rel = "/".join(parts)
        if member.kind == "special":
            raise _refused(archive, f"{member.name} is a device, FIFO or other special file")
        target = root.joinpath(*parts)
        _check_parents(root, parts, archive, member.name)
        if member.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.is_dir():
            raise _refused(archive, f"{member.name} would replace a link or folder unpacked before it")
        if member.kind == "symlink":
            _check_link(member, parts, archive)
            target.unlink(missing_ok=True)
            os.symlink(member.link, target)
        elif member.kind == "hardlink":
            source = _hardlink_source(member, top, archive, written)
            target.unlink(missing_ok=True)
            os.link(root.joinpath(*source), target)
        else:
            total = _write_file(open_member, member, target, archive, total, max_bytes)
            written.add(rel)


def _safe_path(name: str, archive: str) -> list[str]:
    """The member's path parts, or a refusal for ``..``, absolute paths, drive letters and backslashes."""
    if "\\" in name or "\x00" in name:
        raise _refused(archive, f"{name!r} has a backslash or NUL in its path")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _refused(archive, f"{name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise _refused(archive, f"{name!r} climbs out of the folder with ..")
    if any(":" in p for p in parts):
        raise _refused(archive, f"{name!r} has a drive letter or stream name in its path")
    return parts


def _single_top(paths: list[list[str]], members: list[_Member]) -> str | None:
    """The one top folder every member sits under, if there is one (and it is a folder)."""
    tops = {p[0] for p in paths if p}
    if len(tops) != 1:
        return None
    (top,) = tops
    for parts, member in zip(paths, members, strict=True):
        if len(parts) == 1 and member.kind != "dir":
            return None
    return top


def _check_parents(root: Path, parts: list[str], archive: str, name: str) -> None:
    """No member may be written beneath a link: a link to ``.`` would carry the next ``..``-free path out."""
    here = root
    for part in parts[:-1]:
        here = here / part
        if here.is_symlink():
            raise _refused(archive, f"{name} would be written through the link {part}")


def _check_link(member: _Member, parts: list[str], archive: str) -> None:
    link = member.link
    if not link or link.startswith("/") or "\\" in link or (len(link) > 1 and link[1] == ":"):
        raise _refused(archive, f"the link {member.name} -> {link!r} points outside the folder")
    resolved = posixpath.normpath(posixpath.join(*parts[:-1], link) if len(parts) > 1 else link)
    if resolved == ".." or resolved.startswith("../") or resolved.startswith("/"):
        raise _refused(archive, f"the link {member.name} -> {link!r} points outside the folder")


def _hardlink_source(member: _Member, top: str | None, archive: str, written: set[str]) -> list[str]:
    parts = _safe_path(member.link, archive)
    if top is not None and parts and parts[0] == top:
        parts = parts[1:]
    if "/".join(parts) not in written:
        raise _refused(
            archive, f"the hard link {member.name} -> {member.link!r} names no file unpacked before it"
        )
    return parts


def _write_file(
    open_member: Opener, member: _Member, target: Path, archive: str, total: int, max_bytes: int
) -> int:
    executable = bool(member.mode & 0o111)
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as out, open_member(member) as src:
        while block := src.read(_BLOCK):
            total += len(block)
            if total > max_bytes:
                raise _refused(archive, f"it unpacks to more than {format_bytes(max_bytes)} (a zip bomb?)")
            out.write(block)
    os.chmod(target, 0o755 if executable else 0o644)
    return total


def _refused(archive: str, why: str) -> RuntimeInstallError:
    return RuntimeInstallError(
        f"Refusing to unpack {archive}: {why}. Nothing was installed.",
        "This is not how llama.cpp packs its releases: check CLOVER_LLAMACPP_RELEASES points at GitHub or a"
        " faithful mirror.",
    )
