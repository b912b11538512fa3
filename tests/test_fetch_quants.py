"""Quant matching, progress snapshots and cache housekeeping: the pure parts of the download step,
plus adopting a partial left by a killed ``hf_hub_download`` (real huggingface_hub, fake Hub)."""

from __future__ import annotations

import os
import time

import pytest
from helpers_fetch import REPO, gguf_bytes, sha256
from hub_server import HubServer

from clover_local.errors import DownloadError
from clover_local.fetch import cache
from clover_local.fetch.download import download_model
from clover_local.fetch.progress import DownloadProgress, ProgressTracker, status_line
from clover_local.fetch.quants import quant_matches, quant_of, select_quant_files

REAL_LOOKING = [
    "README.md",
    "Clover-35B-A3B-Preview-IQ4_K_M.gguf",
    "Clover-35B-A3B-Preview-Q4_K_M_L.gguf",
    "Q8_0/Clover-35B-A3B-Preview-Q8_0-00002-of-00002.gguf",
    "Q8_0/Clover-35B-A3B-Preview-Q8_0-00001-of-00002.gguf",
    "clover-35b-a3b-preview.q4_k_m.gguf",
    "mmproj-Clover-Q4_K_M.gguf",
]


@pytest.mark.parametrize(
    ("path", "pattern", "expected"),
    [
        ("Model-Q4_K_M.gguf", "Q4_K_M", True),
        ("model.q4_k_m.gguf", "Q4_K_M", True),
        ("Q4_K_M/Model-00001-of-00002.gguf", "Q4_K_M", True),
        ("Model-IQ4_K_M.gguf", "Q4_K_M", False),
        ("Model-Q4_K_M_L.gguf", "Q4_K_M", False),
        ("Model-Q4_K_MX.gguf", "Q4_K_M", False),
        ("Model-Q8_0.gguf", "Q4_K_M", False),
    ],
)
def test_quant_matches_between_separators(path: str, pattern: str, expected: bool) -> None:
    assert quant_matches(path, pattern) is expected


def test_select_picks_one_file_or_all_shards_in_order() -> None:
    assert select_quant_files(REPO, REAL_LOOKING, "Q4_K_M") == ["clover-35b-a3b-preview.q4_k_m.gguf"]
    assert select_quant_files(REPO, REAL_LOOKING, "q8_0") == [
        "Q8_0/Clover-35B-A3B-Preview-Q8_0-00001-of-00002.gguf",
        "Q8_0/Clover-35B-A3B-Preview-Q8_0-00002-of-00002.gguf",
    ]


def test_select_refuses_ambiguity_gaps_and_absence_with_the_facts() -> None:
    with pytest.raises(DownloadError, match=r"(?s)2 different files.*a-Q4_K_M\.gguf.*b-Q4_K_M\.gguf"):
        select_quant_files(REPO, ["a-Q4_K_M.gguf", "b-Q4_K_M.gguf"], "Q4_K_M")
    with pytest.raises(DownloadError, match=r"shard\(s\) \[2\] are missing"):
        select_quant_files(REPO, ["m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"], "Q8_0")
    with pytest.raises(DownloadError, match="Quants in this repo: IQ4_K_M, Q4_K_M, Q4_K_M_L, Q8_0"):
        select_quant_files(REPO, REAL_LOOKING, "Q5_K_M")


def test_quant_of_reads_the_quant_from_a_name() -> None:
    assert quant_of("Q8_0/Clover-Q8_0-00001-of-00002.gguf") == "Q8_0"
    assert quant_of("gemma-3-270m-it-qat-IQ2_XXS.gguf") == "IQ2_XXS"
    assert quant_of("model-bf16.gguf") == "BF16"
    assert quant_of("model.gguf") is None


def test_progress_speed_eta_and_status_line() -> None:
    now = [0.0]
    seen: list[DownloadProgress] = []
    tracker = ProgressTracker(seen.append, [("a.gguf", 1000), ("b.gguf", 3000)], clock=lambda: now[0])
    tracker.start("downloading", 0, already=200)  # resumed: 200 bytes were on disk
    for _ in range(8):
        now[0] += 1.0
        tracker.advance(100)
    last = seen[-1]
    assert (last.done, last.total, last.file_done) == (1000, 4000, 1000)
    assert last.speed_bps == pytest.approx(100.0)
    assert last.eta_s == pytest.approx(30.0)
    assert status_line(last) == ("downloading a.gguf [1/2]  1.0 kB / 4.0 kB (25.0%)  100 B/s  ETA 00:30")
    tracker.finish()
    assert seen[-1].phase == "done" and seen[-1].done == seen[-1].total == 4000


def test_progress_is_rate_limited_but_never_misses_a_file_end() -> None:
    now = [0.0]
    seen: list[DownloadProgress] = []
    tracker = ProgressTracker(seen.append, [("a.gguf", 1000)], clock=lambda: now[0])
    tracker.start("downloading", 0)
    for _ in range(10):
        now[0] += 0.01
        tracker.advance(100)
    assert [p.file_done for p in seen] == [0, 1000]


def test_a_partial_left_by_a_killed_hf_hub_download_is_adopted(hub_server: HubServer) -> None:
    """huggingface_hub leaves ``<etag>.<8 hex>.incomplete`` behind when killed; clover-local continues it."""
    data = gguf_bytes(2 * 1024 * 1024)
    hub_server.add_file(REPO, "m-Q8_0.gguf", data)
    blobs = cache.repo_folder(REPO) / "blobs"
    blobs.mkdir(parents=True)
    etag = sha256(data)
    (blobs / f"{etag}.0123abcd.incomplete").write_bytes(data[: len(data) // 2])
    (blobs / f"{etag}.89abcdef.incomplete").write_bytes(data[:1000])
    assert download_model(REPO, "Q8_0").read_bytes() == data
    assert hub_server.bytes_served(REPO, "m-Q8_0.gguf") == len(data) - len(data) // 2
    assert sorted(p.name for p in blobs.iterdir()) == [etag]


def test_stale_partials_are_removed_live_ones_kept() -> None:
    blobs = cache.repo_folder(REPO) / "blobs"
    blobs.mkdir(parents=True)
    live, gone = "a" * 64, "b" * 64
    ours_live = blobs / f"{live}.incomplete"
    ours_gone = blobs / f"{gone}.incomplete"
    hf_old = blobs / f"{live}.0123abcd.incomplete"
    hf_fresh = blobs / f"{live}.89abcdef.incomplete"
    for path in (ours_live, ours_gone, hf_old, hf_fresh):
        path.write_bytes(b"x")
    old = time.time() - 7200
    for path in (ours_live, ours_gone, hf_old):
        os.utime(path, (old, old))
    removed = cache.remove_stale_partials(REPO, {live})
    assert sorted(removed) == sorted([ours_gone, hf_old])
    assert ours_live.exists() and hf_fresh.exists()  # resumable, and possibly being written right now
