"""A hostile or broken Hub endpoint, CDN or local user against the fetch step (issue 27): the token never
leaves for another host, nothing is written outside the cache, no file is accepted unverified, and settings
are private to their owner."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cdn_server import CdnServer
from helpers_fetch import REPO, gguf_bytes
from hub_server import HubServer

from clover_local import settings
from clover_local.errors import DownloadError, VerificationError
from clover_local.fetch.download import download_model
from clover_local.fetch.remote_header import read_remote_architecture, read_remote_header
from clover_local.user_prefs import Prefs, save_prefs

MODEL = "Clover-Tiny-Q4_K_M.gguf"


@pytest.fixture
def cdn(hub_server: HubServer) -> Iterator[CdnServer]:
    server = CdnServer(hub_server).start()
    try:
        yield server
    finally:
        server.stop()


def _on_cdn(hub: HubServer, cdn: CdnServer, size: int = 200_000) -> bytes:
    data = gguf_bytes(size)
    hub.add_file(REPO, MODEL, data)
    hub.knobs(REPO, MODEL).redirect_to = cdn.url
    return data


def test_header_read_never_sends_the_token_to_the_cdn(
    hub_server: HubServer, cdn: CdnServer, tiny_models: dict[str, Path]
) -> None:
    hub_server.add_file(REPO, MODEL, tiny_models["llama"])
    hub_server.knobs(REPO, MODEL).redirect_to = cdn.url
    described = read_remote_header(REPO, MODEL, token=hub_server.token)
    assert described.architecture.arch == "llama"
    assert cdn.headers_seen, "the header bytes came from the CDN"
    assert not [h for h in cdn.headers_seen if "authorization" in h]


def test_download_and_its_check_never_send_the_token_to_the_cdn(
    hub_server: HubServer, cdn: CdnServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    data = _on_cdn(hub_server, cdn)
    assert read_remote_architecture(REPO, MODEL) == "llama"
    assert download_model(REPO, "Q4_K_M").read_bytes() == data
    assert len(cdn.headers_seen) >= 2  # the architecture check and the transfer
    assert not [h for h in cdn.headers_seen if "authorization" in h]


def _files_outside(root: Path, before: set[Path]) -> set[Path]:
    return {p for p in root.rglob("*")} - before


def test_a_commit_that_is_a_path_is_refused(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.add_file(REPO, MODEL, gguf_bytes(1000))
    hub_server.repos[REPO].commit = "../../../../escaped"
    with pytest.raises(DownloadError, match="not a commit hash"):
        download_model(REPO, "Q4_K_M")
    hf = settings.hf_cache_dir()
    assert not list(hf.parent.parent.rglob("escaped*"))


def test_an_etag_that_is_a_path_is_refused(hub_server: HubServer) -> None:
    hub_server.add_file(REPO, MODEL, gguf_bytes(1000))
    hub_server.knobs(REPO, MODEL).etag = "../../../escaped"
    with pytest.raises(DownloadError, match="not a hash"):
        download_model(REPO, "Q4_K_M")
    assert not list(settings.hf_cache_dir().parent.parent.rglob("escaped*"))


def test_an_etag_that_is_not_the_listed_sha256_is_refused(hub_server: HubServer) -> None:
    hub_server.add_file(REPO, MODEL, gguf_bytes(1000))
    hub_server.knobs(REPO, MODEL).etag = "ab" * 32  # a hash, but not this file's
    with pytest.raises(DownloadError, match="not the hash its listing gives"):
        download_model(REPO, "Q4_K_M")


def test_a_small_file_without_lfs_sha256_is_checked_against_its_git_blob_id(hub_server: HubServer) -> None:
    data = gguf_bytes(5000)
    hub_server.add_file(REPO, MODEL, data, lfs=False)
    hub_server.knobs(REPO, MODEL).corrupt = True
    with pytest.raises(VerificationError, match="git blob id"):
        download_model(REPO, "Q4_K_M")
    hub_server.knobs(REPO, MODEL).corrupt = False
    assert download_model(REPO, "Q4_K_M").read_bytes() == data


def test_header_cache_writes_never_follow_a_planted_temporary_name(
    hub_server: HubServer, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """Another local user (or a second process) owning ``<name>.tmp`` beside a cache file cannot make the
    write land elsewhere: each write has a fresh temporary name of its own."""
    hub_server.add_file(REPO, MODEL, tiny_models["llama"])
    size = tiny_models["llama"].stat().st_size
    target = tmp_path / "victim"
    target.write_text("untouched")
    ref = settings.cache_dir() / "headers" / REPO / "refs" / "main" / MODEL
    ref.parent.mkdir(parents=True)
    ref.with_name(ref.name + ".tmp").symlink_to(target)
    read_remote_header(REPO, MODEL)
    assert target.read_text() == "untouched"
    assert ref.read_text().endswith(f"\n{size}\n")


def test_settings_are_written_private(tmp_path: Path) -> None:
    path = save_prefs(Prefs(), tmp_path / "new" / "config" / "prefs.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700


def test_write_atomically_private_and_shared_modes(tmp_path: Path) -> None:
    from clover_local.user_files import write_atomically

    secret = tmp_path / "keys" / "api.key"
    write_atomically(secret, b"k", private=True)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    shared = tmp_path / "cache" / "header.bin"
    old = os.umask(0o022)
    try:
        write_atomically(shared, b"h")
    finally:
        os.umask(old)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644
    assert [p.name for p in shared.parent.iterdir()] == ["header.bin"]  # no temporary left
