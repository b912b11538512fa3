"""Downloads killed at every phase resume to a verified file: real processes SIGKILLed by
``tests/download_fault_child.py`` against the fake Hub, then a plain ``clover-local download``.

Also the states a kill leaves that used to stick: a complete ``.incomplete`` partial (the Hub answers
``Range: bytes=SIZE-`` with 416), a partial longer than the file, an empty ``tmp_<uuid>`` probe; and a
second download of the same file, which says at once that it waits for the first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import filelock
import pytest
from helpers_fetch import ARCH_READ, REPO, gguf_bytes, sha256
from hub_server import HubServer
from waiting import wait_until

from clover_local.cli import main
from clover_local.fetch import cache

MB = 1024 * 1024
FILE = "Clover-Tiny-Q8_0.gguf"
CHILD = Path(__file__).with_name("download_fault_child.py")
ARGS = ("download", "--repo", REPO, "--quant", "Q8_0")


@pytest.fixture
def data(hub_server: HubServer) -> bytes:
    content = gguf_bytes(6 * MB)
    hub_server.add_file(REPO, FILE, content)
    return content


def kill_at(phase: str, size: int) -> None:
    """Run a download that SIGKILLs itself at ``phase``; check it really died there."""
    env = dict(os.environ, FAULT_FILE_SIZE=str(size), PYTHONPATH=str(CHILD.parent.parent))
    child = subprocess.run(
        [sys.executable, str(CHILD), phase, *ARGS], capture_output=True, text=True, env=env, timeout=300
    )
    assert child.returncode == -signal.SIGKILL, f"{phase}: rc {child.returncode}\n{child.stderr}"


def leftovers(data: bytes) -> list[str]:
    """Files in blobs/ other than the finished blob."""
    blobs = cache.repo_folder(REPO) / "blobs"
    return sorted(p.name for p in blobs.iterdir() if p.name != sha256(data))


def resume_and_check(hub: HubServer, data: bytes, *, at_most: int, kept: tuple[str, ...] = ()) -> None:
    """A plain download finishes the file, fetching at most ``at_most`` bytes, leaving nothing behind
    but the files named in ``kept``."""
    hub.reset_counters()
    assert main([*ARGS]) == 0
    pointer = cache.pointer_path(REPO, hub.commit(REPO), FILE)
    assert pointer.read_bytes() == data
    assert hub.bytes_served(REPO, FILE) <= at_most
    assert leftovers(data) == sorted(kept)
    failed = [r for r in hub.requests if "/resolve/" in r.path and r.status >= 400]
    assert failed == []  # e.g. no 416 for `Range: bytes=SIZE-`


@pytest.mark.parametrize(
    ("phases", "refetch"),
    [
        (["before-transfer"], 1.0),
        (["mid-transfer"], 0.5),
        (["end-of-transfer"], 0.0),
        (["verifying"], 0.0),
        (["rename"], 0.0),
        (["link"], 0.0),
        (["mid-transfer", "checking"], 0.5),
        (["end-of-transfer", "checking", "verifying", "rename"], 0.0),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, list) else None,
)
def test_killed_at_any_phase_the_next_run_finishes_without_refetching(
    hub_server: HubServer, data: bytes, phases: list[str], refetch: float
) -> None:
    for phase in phases:
        kill_at(phase, len(data))
    resume_and_check(hub_server, data, at_most=int(refetch * len(data)))


def test_complete_partial_left_at_the_rename_is_verified_and_put_in_place(
    hub_server: HubServer, data: bytes
) -> None:
    # The state from the report: the whole file in `<sha>.incomplete`, no snapshot (killed at the rename).
    assert main([*ARGS]) == 0
    blob = cache.blob_path(REPO, sha256(data))
    os.replace(blob, cache.partial_path(REPO, sha256(data)))
    shutil.rmtree(cache.repo_folder(REPO) / "snapshots")
    resume_and_check(hub_server, data, at_most=0)
    assert not any(r.range for r in hub_server.requests)  # no `Range: bytes=SIZE-`, so no 416


def test_complete_partial_with_wrong_bytes_is_moved_aside(hub_server: HubServer, data: bytes) -> None:
    partial = cache.partial_path(REPO, sha256(data))
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"GGUF" + bytes(len(data) - 4))
    assert main([*ARGS]) == 1
    assert cache.blob_path(REPO, sha256(data)).with_name(sha256(data) + ".corrupt").exists()
    resume_and_check(hub_server, data, at_most=len(data), kept=(sha256(data) + ".corrupt",))


def test_partial_longer_than_the_file_is_discarded(hub_server: HubServer, data: bytes) -> None:
    partial = cache.partial_path(REPO, sha256(data))
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data + b"trailing garbage")
    resume_and_check(hub_server, data, at_most=len(data))


def test_old_empty_permission_probes_are_cleaned_up(hub_server: HubServer, data: bytes) -> None:
    blobs = cache.repo_folder(REPO) / "blobs"
    blobs.mkdir(parents=True)
    probe = blobs / "tmp_0f3c1a52-6a0e-4a57-9d4e-2b1f3c4d5e6f"
    probe.touch()
    hour_ago = time.time() - 7200
    os.utime(probe, (hour_ago, hour_ago))
    resume_and_check(hub_server, data, at_most=len(data) + ARCH_READ)  # a fresh download: checked first
    assert not probe.exists()


def test_second_download_of_the_same_file_says_at_once_that_it_waits(
    hub_server: HubServer, data: bytes
) -> None:
    lock = filelock.FileLock(str(cache.lock_path(REPO, sha256(data))))
    cache.lock_path(REPO, sha256(data)).parent.mkdir(parents=True, exist_ok=True)
    lock.acquire()  # another process (an `hf download`, say) is fetching this blob
    child = subprocess.Popen(
        [sys.executable, "-m", "clover_local", *ARGS], stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in child.stderr or []], daemon=True)
    reader.start()
    try:
        wait_until(
            lambda: any("another download of this file" in line for line in lines), "the waiting notice"
        )
        # Only the architecture check's first bytes, read before the download waits for the lock.
        assert child.poll() is None and hub_server.bytes_served(REPO, FILE) == ARCH_READ
    finally:
        lock.release()
    assert child.wait(timeout=300) == 0
    reader.join(timeout=60)
    assert cache.pointer_path(REPO, hub_server.commit(REPO), FILE).read_bytes() == data
