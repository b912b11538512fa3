"""download_model / verify_files against the fake Hub with the real huggingface_hub: shards, resume,
verification, disk space, offline use, Hub errors."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from helpers_fetch import REPO, add_shards, gguf_bytes, sha256
from hub_server import HubServer
from huggingface_hub import constants, hf_hub_download
from waiting import wait_until

from clover_local.errors import (
    DownloadCancelled,
    DownloadError,
    HubUnreachableError,
    NotEnoughDiskError,
    VerificationError,
)
from clover_local.fetch import cache
from clover_local.fetch.download import (
    cached_ggufs,
    cached_model_path,
    download_model,
    resolve_quant_files,
    verify_files,
)
from clover_local.fetch.progress import DownloadProgress

MB = 1024 * 1024


def dead_endpoint() -> str:
    """An http URL on 127.0.0.1 where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def split_repo(hub_server: HubServer) -> dict[str, bytes]:
    """A repo with a 3-shard Q4_K_M in a subfolder (as on the real Hub), a Q8_0 and an IQ4 decoy."""
    hub_server.add_file(REPO, "README.md", "# tiny\n")
    shards = add_shards(hub_server, REPO, "Q4_K_M/Clover-Tiny-Q4_K_M", [MB + 7, MB, 300_001])
    hub_server.add_file(REPO, "Clover-Tiny-Q8_0.gguf", gguf_bytes(2 * MB))
    hub_server.add_file(REPO, "Clover-Tiny-IQ4_K_M.gguf", gguf_bytes(1000))
    return shards


def test_multi_shard_quant_lands_in_the_hf_cache_layout(
    hub_server: HubServer, split_repo: dict[str, bytes]
) -> None:
    seen: list[DownloadProgress] = []
    path = download_model(REPO, "q4_k_m", progress=seen.append)

    names = sorted(split_repo)
    commit = hub_server.commit(REPO)
    assert path == cache.pointer_path(REPO, commit, names[0])
    for name in names:
        pointer = cache.pointer_path(REPO, commit, name)
        assert pointer.is_symlink()
        assert pointer.read_bytes() == split_repo[name]
        assert pointer.resolve().name == sha256(
            split_repo[name]
        )  # blobs/<sha256>, as huggingface_hub names them
    assert (cache.repo_folder(REPO) / "refs" / "main").read_text() == commit
    # Only the quant's files were fetched, each once.
    assert hub_server.bytes_served(REPO, "Clover-Tiny-Q8_0.gguf") == 0
    assert hub_server.bytes_served(REPO, "Clover-Tiny-IQ4_K_M.gguf") == 0
    assert sum(hub_server.bytes_served(REPO, n) for n in names) == sum(map(len, split_repo.values()))

    # Progress: totals fixed, bytes never go back, ends done at 100%.
    total = sum(map(len, split_repo.values()))
    assert {p.total for p in seen} == {total}
    downloading = [p.done for p in seen if p.phase == "downloading"]
    assert downloading == sorted(downloading)
    assert {p.phase for p in seen} >= {"downloading", "verifying", "done"}
    assert seen[-1].phase == "done" and seen[-1].done == total and seen[-1].file_count == 3

    # huggingface_hub sees the files as cached: it asks (HEAD) but downloads nothing.
    again = hf_hub_download(REPO, names[1])
    assert Path(again).read_bytes() == split_repo[names[1]]
    assert sum(hub_server.bytes_served(REPO, n) for n in names) == total


def test_second_download_is_served_from_the_cache(
    hub_server: HubServer, split_repo: dict[str, bytes]
) -> None:
    first = download_model(REPO, "Q4_K_M")
    hub_server.reset_counters()
    assert download_model(REPO, "Q4_K_M") == first
    assert sum(hub_server.bytes_served(REPO, n) for n in split_repo) == 0


def test_cancel_keeps_the_partial_and_the_next_run_resumes(hub_server: HubServer) -> None:
    data = gguf_bytes(4 * MB)
    hub_server.add_file(REPO, "Clover-Tiny-Q8_0.gguf", data)
    hub_server.knobs(REPO, "Clover-Tiny-Q8_0.gguf").throttle_bps = 8 * MB
    cancel = threading.Event()

    def stop_at_half(p: DownloadProgress) -> None:
        if p.phase == "downloading" and p.done >= len(data) // 2:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        download_model(REPO, "Q8_0", progress=stop_at_half, cancel=cancel)
    partial = cache.partial_path(REPO, sha256(data))
    assert len(data) // 2 <= partial.stat().st_size < len(data)

    wait_until(lambda: hub_server.streams_open == 0, "the server to notice the closed transfer")
    hub_server.reset_counters()
    hub_server.knobs(REPO, "Clover-Tiny-Q8_0.gguf").throttle_bps = None
    path = download_model(REPO, "Q8_0")
    assert path.read_bytes() == data
    assert hub_server.bytes_served(REPO, "Clover-Tiny-Q8_0.gguf") < 0.6 * len(data)
    assert not partial.exists()
    ranges = [r.range for r in hub_server.requests if r.method == "GET" and "resolve" in r.path]
    assert ranges and ranges[0] is not None and ranges[0].startswith("bytes=")


def test_connection_dropped_midway_resumes_in_the_same_call(hub_server: HubServer) -> None:
    data = gguf_bytes(3 * MB)
    hub_server.add_file(REPO, "Clover-Tiny-Q8_0.gguf", data)
    knobs = hub_server.knobs(REPO, "Clover-Tiny-Q8_0.gguf")
    knobs.drop_after, knobs.drop_times = MB, 2  # two drops in a row, a megabyte each

    path = download_model(REPO, "Q8_0")
    assert path.read_bytes() == data
    # Every byte crossed the wire once: each retry asked for the rest with Range.
    assert hub_server.bytes_served(REPO, "Clover-Tiny-Q8_0.gguf") == len(data)
    ranges = [r.range for r in hub_server.requests if r.method == "GET" and "resolve" in r.path]
    assert ranges == [None, f"bytes={MB}-", f"bytes={2 * MB}-"]


def test_hub_gone_midway_keeps_the_partial_and_the_next_run_resumes(
    hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = gguf_bytes(3 * MB)
    hub_server.add_file(REPO, "Clover-Tiny-Q8_0.gguf", data)
    hub_server.knobs(REPO, "Clover-Tiny-Q8_0.gguf").throttle_bps = 4 * MB

    def hub_dies(p: DownloadProgress) -> None:  # stop() also cuts the connection being served
        if p.phase == "downloading" and p.done > 0:
            hub_server.stop()

    with pytest.raises(HubUnreachableError, match="saved; the next run continues"):
        download_model(REPO, "Q8_0", progress=hub_dies)
    kept = cache.partial_path(REPO, sha256(data)).stat().st_size
    assert 0 < kept < len(data)

    # The network is back (a new server with the same repo): only the rest is fetched.
    back = HubServer().start()
    try:
        back.add_file(REPO, "Clover-Tiny-Q8_0.gguf", data)
        monkeypatch.setenv("HF_ENDPOINT", back.url)
        monkeypatch.setattr(constants, "ENDPOINT", back.url)
        assert download_model(REPO, "Q8_0").read_bytes() == data
        assert back.bytes_served(REPO, "Clover-Tiny-Q8_0.gguf") == len(data) - kept
    finally:
        back.stop()


def test_corrupt_transfer_is_moved_aside_never_used(hub_server: HubServer) -> None:
    data = gguf_bytes(2 * MB)
    hub_server.add_file(REPO, "Clover-Tiny-Q8_0.gguf", data)
    hub_server.knobs(REPO, "Clover-Tiny-Q8_0.gguf").corrupt = True
    with pytest.raises(VerificationError, match="sha256") as err:
        download_model(REPO, "Q8_0")
    etag = sha256(data)
    assert not cache.blob_path(REPO, etag).exists()
    assert not cache.pointer_path(REPO, hub_server.commit(REPO), "Clover-Tiny-Q8_0.gguf").exists()
    assert cache.blob_path(REPO, etag + cache.CORRUPT_SUFFIX).exists()
    assert "again" in str(err.value)

    hub_server.knobs(REPO, "Clover-Tiny-Q8_0.gguf").corrupt = False
    assert download_model(REPO, "Q8_0").read_bytes() == data


def test_verify_catches_a_blob_damaged_on_disk(hub_server: HubServer) -> None:
    data = gguf_bytes(MB)
    hub_server.add_file(REPO, "Clover-Tiny-Q8_0.gguf", data)
    path = download_model(REPO, "Q8_0")
    checks = verify_files(REPO, "Q8_0")
    assert [c.ok for c in checks] == [True] and checks[0].actual_sha256 == sha256(data)

    blob = path.resolve()
    blob.chmod(0o644)
    with blob.open("r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02")
    with pytest.raises(VerificationError, match="corrupt"):
        verify_files(REPO, "Q8_0")
    assert not path.exists() and not blob.exists()  # out of use: no snapshot link, no blob
    assert download_model(REPO, "Q8_0").read_bytes() == data  # fetched fresh


def test_not_enough_disk_refuses_before_any_transfer_with_both_numbers(
    hub_server: HubServer, split_repo: dict[str, bytes]
) -> None:
    with pytest.raises(NotEnoughDiskError) as err:
        download_model(REPO, "Q4_K_M", free_space=lambda _path: 5_000_000)
    message = str(err.value)
    assert "2.4 MB still to download" in message and "5.0 MB free" in message
    assert sum(hub_server.bytes_served(REPO, n) for n in split_repo) == 0


def test_offline_reuses_the_cache_and_explains_what_is_missing(
    hub_server: HubServer, split_repo: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = download_model(REPO, "Q4_K_M")
    hub_server.reset_counters()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert download_model(REPO, "Q4_K_M") == path
    assert cached_model_path(REPO, "Q4_K_M") == path
    assert hub_server.requests == []
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE"):
        download_model(REPO, "Q8_0")

    # Network down (nothing answers at the endpoint) behaves the same for cached files.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", dead_endpoint())
    assert download_model(REPO, "Q4_K_M") == path
    with pytest.raises(HubUnreachableError, match="unreachable"):
        download_model(REPO, "Q8_0")


def test_gated_repo_explains_how_to_log_in(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    hub_server.add_repo("acme/Gated-GGUF", gated=True)
    data = gguf_bytes(1000)
    hub_server.add_file("acme/Gated-GGUF", "Gated-Q4_K_M.gguf", data)
    with pytest.raises(DownloadError) as err:
        download_model("acme/Gated-GGUF", "Q4_K_M")
    assert "gated" in str(err.value) and "hf auth login" in str(err.value) and "HF_TOKEN" in str(err.value)
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    assert download_model("acme/Gated-GGUF", "Q4_K_M").read_bytes() == data


def test_ambiguous_quant_lists_the_candidates(hub_server: HubServer) -> None:
    hub_server.add_file(REPO, "Clover-Tiny-Q4_K_M.gguf", gguf_bytes(100))
    hub_server.add_file(REPO, "Clover-Tiny-UD-Q4_K_M.gguf", gguf_bytes(100))
    with pytest.raises(DownloadError) as err:
        resolve_quant_files(REPO, "Q4_K_M")
    assert "Clover-Tiny-Q4_K_M.gguf" in str(err.value) and "Clover-Tiny-UD-Q4_K_M.gguf" in str(err.value)
    assert "--file" in str(err.value)
    # Naming the file picks one.
    assert download_model(REPO, filename="Clover-Tiny-UD-Q4_K_M.gguf").name == "Clover-Tiny-UD-Q4_K_M.gguf"


def test_rate_limited_download_waits_and_succeeds(hub_server: HubServer) -> None:
    data = gguf_bytes(MB)
    hub_server.add_file(REPO, "Clover-Tiny-Q8_0.gguf", data)
    knobs = hub_server.knobs(REPO, "Clover-Tiny-Q8_0.gguf")
    knobs.fail_429_times, knobs.retry_after = 2, 0
    assert download_model(REPO, "Q8_0").read_bytes() == data
    statuses = [r.status for r in hub_server.requests if r.method == "GET" and "resolve" in r.path]
    assert statuses == [429, 429, 200]


def test_hub_errors_read_as_sentences(hub_server: HubServer, split_repo: dict[str, bytes]) -> None:
    with pytest.raises(DownloadError, match="acme/nope was not found"):
        download_model("acme/nope", "Q4_K_M")
    with pytest.raises(DownloadError, match=r"has no file 'missing\.gguf'"):
        download_model(REPO, filename="missing.gguf")
    with pytest.raises(DownloadError, match=r"Quants in this repo: .*Q8_0"):
        download_model(REPO, "Q5_K_S")


def test_cached_ggufs_lists_models_by_first_shard(
    hub_server: HubServer, split_repo: dict[str, bytes]
) -> None:
    assert cached_ggufs() == []
    path = download_model(REPO, "Q4_K_M")
    (entry,) = cached_ggufs()
    assert entry.repo == REPO and entry.path == path and entry.n_shards == 3 and entry.complete
    assert entry.quant == "Q4_K_M" and entry.size_bytes == sum(map(len, split_repo.values()))
    assert entry.refs == ("main",)
