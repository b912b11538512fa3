"""Install and remove upstream llama.cpp runtimes beside the pinned build.

An install resolves the release, picks the prebuilt archive for this machine (:mod:`.assets`) or builds the
release's source (:mod:`.build`), downloads with resume and sha256 verification (:mod:`.download`), unpacks
safely (:mod:`.extract`) into ``runtimes/.partial-<tag>-<random>`` with that tag's sources beside the binary
(:mod:`.installed`), runs ``llama-server --version``, writes the manifest last and renames the folder into
place. A kill at any point leaves no half runtime; the next run removes the leftovers and continues the
download where it stopped.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock
import httpx2

from clover_local import settings
from clover_local.errors import NoArchiveError, RuntimeInstallError, UsageError
from clover_local.fetch.progress import ProgressCallback, ProgressTracker
from clover_local.runtimes import build, net
from clover_local.runtimes.assets import (
    BACKENDS,
    ArchiveChoice,
    Target,
    choose_archive,
    normalize_arch,
    normalize_os,
    target_for,
)
from clover_local.runtimes.download import RemoteFile, check_cancelled, fetch_verified
from clover_local.runtimes.extract import extract_archive
from clover_local.runtimes.installed import (
    ARCH_SOURCE,
    ARG_SOURCE,
    InstalledRuntime,
    read_runtime,
    valid_tag,
    write_manifest,
)
from clover_local.runtimes.releases import Release, fetch_release, fetch_source_file, source_file_url

Notify = Callable[[str], None]
SERVER_NAMES = ("llama-server", "llama-server.exe")
RAW_SOURCES = {ARCH_SOURCE: build.ARCH_SOURCE, ARG_SOURCE: build.ARG_SOURCE}
"""Kept beside the binary (name -> path in the llama.cpp tree): what it loads, and the flags it takes."""
MAX_SOURCE_TARBALL = 1024**3
DOWNLOADS = ".downloads"
VERSION_TIMEOUT_S = 60.0
_LEFTOVER_PREFIXES = (".partial-", ".old-", ".removing-")


@dataclass(frozen=True)
class _Staged:
    manifest: dict[str, object]
    downloads: tuple[Path, ...]
    """Downloaded files to delete once the runtime is in place."""
    work: Path | None = None
    """A build folder to delete once the runtime is in place."""


def install(
    tag: str = "latest",
    *,
    backend: str | None = None,
    from_source: bool = False,
    force: bool = False,
    allow_unverified: bool = False,
    progress: ProgressCallback | None = None,
    notify: Notify | None = None,
    target: Target | None = None,
    jobs: int | None = None,
    cancel: threading.Event | None = None,
    build_if_no_archive: bool = True,
) -> InstalledRuntime:
    """Install llama.cpp release ``tag`` (``latest``: the newest) into ``runtimes_dir()/<tag>``; the runtime.

    ``backend`` narrows the archive (``cpu``, ``cuda``, ``cuda-12``, ``cuda-13``, ``vulkan``, ``rocm``, ``metal``);
    ``from_source`` builds the release's source instead, as happens anyway when no archive fits ``target`` (default:
    this machine) unless ``build_if_no_archive`` is False (then :class:`NoArchiveError`, so a caller can ask
    first). A release already installed is returned as it is unless ``force``. ``allow_unverified`` accepts an
    archive the release publishes no digest for. ``notify`` hears each step in words, ``progress`` the bytes.
    ``cancel`` stops the install between steps and during transfers; nothing is installed then, and a partial
    download is kept for the next run. A successful install deletes the downloads other tags left, unless
    an install of that tag is running (:func:`clear_stale_downloads`)."""
    say = notify or (lambda _message: None)
    if backend is not None and backend not in (*BACKENDS, "cuda"):
        raise UsageError(f"Unknown backend {backend!r}.", f"Choose one of {', '.join(BACKENDS)} (or cuda).")
    base = settings.runtimes_dir()
    with net.client() as http:
        release = fetch_release(tag, http)
        folder = base / release.tag
        existing = read_runtime(folder)
        if existing is not None and not force:
            say(
                f"llama.cpp {release.tag} is already installed ({existing.backend}, {existing.origin}) in {folder};"
                " --force installs it again."
            )
            return existing
        base.mkdir(parents=True, exist_ok=True)
        with _tag_lock(base, release.tag, say):
            _remove_leftovers(base, release.tag)
            aim = target or host_target(backend)
            choice = None if from_source else choose_archive(release.asset_names, release.tag, aim)
            if choice is None and not from_source:
                if not build_if_no_archive:
                    raise NoArchiveError(release.tag, f"{aim.os} {aim.arch} ({' or '.join(aim.backends)})")
                say(
                    f"Release {release.tag} has no prebuilt archive for {aim.os} {aim.arch}"
                    f" ({' or '.join(aim.backends)}): building it from source."
                )
            partial = base / f".partial-{release.tag}-{secrets.token_hex(4)}"
            partial.mkdir()
            try:
                if choice is not None:
                    staged = _stage_archives(
                        release, choice, partial, http, say, progress, allow_unverified, cancel
                    )
                else:
                    staged = _stage_source(release, backend, partial, http, say, progress, jobs, cancel)
                check_cancelled(cancel)
                _check_runs(partial / str(staged.manifest["server"]))
                check_cancelled(cancel)
                installed = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                manifest = {
                    "tag": release.tag,
                    **staged.manifest,
                    "arg_source": ARG_SOURCE,
                    "installed": installed,
                }
                write_manifest(partial, manifest)  # last: a folder with a manifest is complete
                _move_into_place(base, partial, folder)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            for path in staged.downloads:
                path.unlink(missing_ok=True)
            if staged.work is not None:
                shutil.rmtree(staged.work, ignore_errors=True)
        clear_stale_downloads()  # this tag's emptied folder too, now that its lock is free
    runtime = read_runtime(folder)
    if runtime is None:  # only if something outside this process changed the folder just now
        raise RuntimeInstallError(
            f"{folder} was installed but cannot be read back.", "Run the install again."
        )
    say(f"Installed {runtime.label} in {folder}.")
    return runtime


def remove(tag: str) -> Path:
    """Remove the installed runtime ``tag`` (renamed out of sight first, then deleted); its former folder."""
    if not valid_tag(tag):
        raise UsageError(
            f"{tag!r} is not a llama.cpp release tag.", "Name one `clover-local runtime list` shows."
        )
    base = settings.runtimes_dir()
    folder = base / tag
    if not folder.is_dir():
        raise RuntimeInstallError(
            f"llama.cpp {tag} is not installed (no {folder}).", "`clover-local runtime list` shows what is."
        )
    with _tag_lock(base, tag, lambda _m: None):
        trash = base / f".removing-{tag}-{secrets.token_hex(4)}"
        os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)
    clear_stale_downloads()
    return folder


def downloads_dir(tag: str) -> Path:
    """Where the files of one tag's install are downloaded (``runtimes/.downloads/<tag>/``): kept across runs,
    so an interrupted download continues, until the install succeeds."""
    return settings.runtimes_dir() / DOWNLOADS / tag


def clear_stale_downloads() -> tuple[Path, ...]:
    """Delete the downloads of every tag that no install is working on now (its lock is free); what was
    deleted. Loose files in ``.downloads/`` are from an older layout and never resumed, so they go too.
    Called after a successful install and by :func:`remove`."""
    base = settings.runtimes_dir()
    try:
        entries = sorted((base / DOWNLOADS).iterdir())
    except OSError:
        return ()
    cleared: list[Path] = []
    for entry in entries:
        if not (entry.is_dir() and valid_tag(entry.name)):
            with contextlib.suppress(OSError):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                cleared.append(entry)
            continue
        lock = filelock.FileLock(str(base / f".lock-{entry.name}"))
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            continue  # an install of that tag is running: its download is not stale
        try:
            shutil.rmtree(entry, ignore_errors=True)
            cleared.append(entry)
        finally:
            lock.release()
    return tuple(cleared)


def host_target(backend: str | None = None) -> Target:
    """This machine as an archive target: its OS, CPU and the GPU backends it can use (:func:`target_for`)."""
    import platform

    from clover_local.detect import detect_machine
    from clover_local.detect.nvidia import cuda_driver_version, load_nvml

    if backend is not None and backend != "cuda":  # no GPU to probe: the OS and CPU are enough
        os_name, arch = normalize_os(platform.system()), normalize_arch(platform.machine())
        return Target(os_name, arch, (backend,), f"asked for with --backend {backend}")
    machine = detect_machine()
    driver = cuda_driver_version(load_nvml()) if any(g.vendor == "nvidia" for g in machine.gpus) else None
    return target_for(machine, cuda_driver=driver, backend=backend)


def locate_server(folder: Path) -> Path:
    """The ``llama-server`` binary in an unpacked or built runtime (archives nest it in a top folder or
    ``build/bin/``): the shallowest one."""
    found = sorted(
        (p for p in folder.rglob("llama-server*") if p.name in SERVER_NAMES and p.is_file()),
        key=lambda p: (len(p.relative_to(folder).parts), str(p)),
    )
    if not found:
        raise RuntimeInstallError(
            f"No llama-server in the unpacked runtime ({folder}); nothing was installed.",
            "This release's archive does not ship llama-server: try --from-source, or another release.",
        )
    return found[0]


def _stage_archives(
    release: Release,
    choice: ArchiveChoice,
    partial: Path,
    http: httpx2.Client,
    say: Notify,
    progress: ProgressCallback | None,
    allow_unverified: bool,
    cancel: threading.Event | None,
) -> _Staged:
    assets = [release.asset(name) for name in (choice.asset, *choice.extras)]
    items = [RemoteFile(a.name, a.url, a.size, a.sha256) for a in assets if a is not None]
    say(f"Downloading {', '.join(i.name for i in items)} ({choice.backend}) from release {release.tag}.")
    tracker = ProgressTracker(progress, [(i.name, i.size or 0) for i in items])
    fetched: list[tuple[RemoteFile, Path, str]] = []
    for index, item in enumerate(items):
        path, digest = fetch_verified(
            item,
            downloads_dir(release.tag),
            tracker=tracker,
            index=index,
            http=http,
            allow_unverified=allow_unverified,
            cancel=cancel,
        )
        fetched.append((item, path, digest))
    tracker.finish()
    for item, path, _ in fetched:
        check_cancelled(cancel)
        say(f"Unpacking {item.name}.")
        extract_archive(path, partial)
    server = locate_server(partial)
    _fetch_raw_sources(release.tag, partial, server.parent, http, say)
    return _Staged(
        manifest={
            "backend": choice.backend,
            "origin": "archive",
            "server": server.relative_to(partial).as_posix(),
            "asset": choice.asset,
            "sha256": fetched[0][2],
            "assets": [
                {"name": i.name, "sha256": d, "verified": i.sha256 is not None} for i, _, d in fetched
            ],
        },
        downloads=tuple(p for _, p, _ in fetched),
    )


def _stage_source(
    release: Release,
    backend: str | None,
    partial: Path,
    http: httpx2.Client,
    say: Notify,
    progress: ProgressCallback | None,
    jobs: int | None,
    cancel: threading.Event | None,
) -> _Staged:
    if release.tarball_url is None:
        raise RuntimeInstallError(
            f"Release {release.tag} names no source tarball (tarball_url); cannot build it."
        )
    build_backend, why = (
        (build.build_backend_for(backend), "asked for with --backend")
        if backend
        else build.detect_backend(say)
    )
    item = RemoteFile(f"llama.cpp-{release.tag}-source.tar.gz", release.tarball_url, None, None)
    say(f"Downloading the source of llama.cpp {release.tag}.")
    tracker = ProgressTracker(progress, [(item.name, 0)])
    tarball, digest = fetch_verified(
        item,
        downloads_dir(release.tag),
        tracker=tracker,
        index=0,
        http=http,
        allow_unverified=True,  # GitHub publishes no digest for a source tarball: its sha256 is recorded instead
        max_bytes=MAX_SOURCE_TARBALL,
        cancel=cancel,
    )
    tracker.finish()
    say(f"The source tarball has no published digest; its sha256 {digest} goes into the manifest.")
    work = settings.cache_dir() / "runtime-builds" / f"{release.tag}-{build_backend}"
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    extract_archive(tarball, src)
    check_cancelled(cancel)
    say(f"Building llama-server {release.tag} for {build_backend} ({why}); this takes a while.")
    try:
        bin_dir = build.cmake_build(
            src,
            work / "build",
            build_backend,
            release.tag,
            jobs or os.cpu_count() or 1,
            ("llama-server",),
            say,
        )
    except FileNotFoundError as exc:
        raise RuntimeInstallError(
            f"Cannot build llama.cpp: {exc.filename or 'cmake'} is not installed.",
            "Install CMake and a C++ compiler (and the GPU toolkit for a GPU build), or install a prebuilt archive.",
        ) from None
    except subprocess.CalledProcessError as exc:
        raise RuntimeInstallError(
            f"A build step of llama.cpp {release.tag} failed (exit {exc.returncode}): {' '.join(map(str, exc.cmd))}",
            "The output above says why; a build folder is kept in the cache, so running it again continues.",
        ) from None
    binary = next((bin_dir / n for n in SERVER_NAMES if (bin_dir / n).is_file()), None)
    if binary is None:
        raise RuntimeInstallError(f"The build of llama.cpp {release.tag} made no llama-server in {bin_dir}.")
    shutil.copy2(binary, partial / binary.name)
    (partial / binary.name).chmod(0o755)
    build.keep_sources(src, partial, (build.ARG_SOURCE, build.ARCH_SOURCE), say)
    return _Staged(
        manifest={
            "backend": build.runtime_backend(build_backend),
            "origin": "source",
            "server": binary.name,
            "asset": None,
            "sha256": digest,
            "assets": [{"name": item.name, "sha256": digest, "verified": False}],
        },
        downloads=(tarball,),
        work=work,
    )


def _fetch_raw_sources(tag: str, partial: Path, beside: Path, http: httpx2.Client, say: Notify) -> None:
    """That tag's ``llama-arch.cpp`` and ``arg.cpp`` from the raw-file base, into the runtime folder (and beside
    the binary when it is nested)."""
    from clover_local.arch_support import parse_llama_arch

    for name, rel in RAW_SOURCES.items():
        url = source_file_url(tag, rel)
        body = fetch_source_file(tag, rel, http)
        text = body.decode("utf-8", errors="replace")
        if name == ARCH_SOURCE:
            try:
                table = parse_llama_arch(text, url)
            except ValueError:
                raise RuntimeInstallError(
                    f"{url} is not llama.cpp's {rel} (no architecture table in it); nothing was installed.",
                    "Check CLOVER_LLAMACPP_RAW points at raw.githubusercontent.com/ggml-org/llama.cpp or a mirror.",
                ) from None
            say(f"llama.cpp {tag} loads {len(table.names)} architectures ({rel}).")
        elif "common_arg" not in text:
            raise RuntimeInstallError(
                f"{url} is not llama.cpp's {rel} (no option table in it); nothing was installed.",
                "Check CLOVER_LLAMACPP_RAW points at raw.githubusercontent.com/ggml-org/llama.cpp or a mirror.",
            )
        for folder in {partial, beside}:
            (folder / name).write_bytes(body)


def _check_runs(server: Path) -> None:
    """``llama-server --version`` must work here: an archive built for another system fails now, not at launch."""
    try:
        done = subprocess.run(
            [str(server), "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeInstallError(
            f"The unpacked llama-server cannot run on this machine ({exc}); nothing was installed."
        ) from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeInstallError(
            f"The unpacked llama-server does not run here (exit {done.returncode}): {' / '.join(tail)}. Nothing"
            " was installed.",
            "Try another --backend, or --from-source to build one for this machine.",
        )


def _move_into_place(base: Path, partial: Path, folder: Path) -> None:
    """One rename makes the runtime visible; an older install of the tag (``--force``) is moved aside first."""
    if folder.exists() or folder.is_symlink():
        old = base / f".old-{folder.name}-{secrets.token_hex(4)}"
        os.replace(folder, old)
        os.replace(partial, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, folder)


def _remove_leftovers(base: Path, tag: str) -> None:
    """Folders a killed install or removal of ``tag`` left (called with the tag's lock held)."""
    for prefix in _LEFTOVER_PREFIXES:
        for path in base.glob(f"{prefix}{tag}-*"):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _tag_lock(base: Path, tag: str, say: Notify) -> Iterator[None]:
    """One install or removal of a tag at a time (other processes wait, and are told why)."""
    lock = filelock.FileLock(str(base / f".lock-{tag}"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        say(f"Another install of llama.cpp {tag} is running; waiting for it to finish.")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
