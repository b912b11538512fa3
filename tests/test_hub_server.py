"""The fake Hub (tests/hub_server.py) checked with the real huggingface_hub: if these pass, code under test that
uses huggingface_hub against the fake behaves as it would against huggingface.co (plain HTTP, no Xet)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import huggingface_hub
import pytest
from hub_server import HubServer
from huggingface_hub import HfApi, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils import build_hf_headers, get_session

REPO = "acme/tiny-GGUF"
GATED = "acme/gated-GGUF"
WEIGHTS = os.urandom(3 * 1024 * 1024 + 123)  # 3 MiB and a bit: several chunks, odd tail
README = b"# tiny\nA test repo.\n"


@pytest.fixture
def hub(hub_server: HubServer) -> HubServer:
    hub_server.add_file(REPO, "README.md", README)
    hub_server.add_file(REPO, "tiny-Q4_K_M.gguf", WEIGHTS)
    hub_server.add_file(REPO, "sub/dir/tiny-Q8_0-00001-of-00002.gguf", b"GGUF" + b"\0" * 100)
    hub_server.add_repo(GATED, gated=True)
    hub_server.add_file(GATED, "model.gguf", b"GGUF" + b"\1" * 1000)
    return hub_server


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_huggingface_hub_is_pointed_at_the_fake(hub: HubServer) -> None:
    assert hub.url.startswith("http://127.0.0.1:")
    assert hf_hub_url(REPO, "README.md").startswith(hub.url + "/")
    assert HfApi().endpoint == hub.url


def test_hf_hub_download_small_and_lfs_files(hub: HubServer) -> None:
    readme = Path(hf_hub_download(REPO, "README.md"))
    weights = Path(hf_hub_download(REPO, "tiny-Q4_K_M.gguf"))
    assert readme.read_bytes() == README
    assert weights.read_bytes() == WEIGHTS
    assert hub.bytes_served(REPO, "tiny-Q4_K_M.gguf") == len(WEIGHTS)
    # The blob in the cache is named by the sha256 for LFS files, as with the real Hub.
    assert weights.resolve().name == sha256(WEIGHTS)
    # A second call is served from the cache: a HEAD, no body.
    hf_hub_download(REPO, "tiny-Q4_K_M.gguf")
    assert hub.bytes_served(REPO, "tiny-Q4_K_M.gguf") == len(WEIGHTS)


def test_download_from_disk_in_chunks(hub: HubServer, tmp_path: Path) -> None:
    big = tmp_path / "big.gguf"
    big.write_bytes(WEIGHTS * 2)
    hub.add_file(REPO, "big.gguf", big)
    out = hf_hub_download(REPO, "big.gguf", local_dir=tmp_path / "out")
    assert Path(out).read_bytes() == WEIGHTS * 2


def test_listing_info_and_paths_info(hub: HubServer) -> None:
    api = HfApi()
    assert sorted(huggingface_hub.list_repo_files(REPO)) == [
        "README.md",
        "sub/dir/tiny-Q8_0-00001-of-00002.gguf",
        "tiny-Q4_K_M.gguf",
    ]
    top = {e.path: e for e in api.list_repo_tree(REPO)}
    assert set(top) == {"README.md", "sub", "tiny-Q4_K_M.gguf"}
    assert isinstance(top["sub"], RepoFolder)
    weights = top["tiny-Q4_K_M.gguf"]
    assert isinstance(weights, RepoFile)
    assert weights.size == len(WEIGHTS)
    assert weights.lfs is not None and weights.lfs.sha256 == sha256(WEIGHTS)
    assert weights.xet_hash is None
    readme = top["README.md"]
    assert isinstance(readme, RepoFile) and readme.lfs is None
    assert readme.blob_id == hashlib.sha1(b"blob %d\0" % len(README) + README).hexdigest()

    deep = [e.path for e in api.list_repo_tree(REPO, path_in_repo="sub", recursive=True)]
    assert deep == ["sub/dir", "sub/dir/tiny-Q8_0-00001-of-00002.gguf"]

    info = api.model_info(REPO, files_metadata=True)
    assert info.sha == hub.commit(REPO)
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    assert sizes["tiny-Q4_K_M.gguf"] == len(WEIGHTS)
    lfs = {s.rfilename: s.lfs for s in info.siblings or []}
    assert lfs["tiny-Q4_K_M.gguf"] is not None and lfs["tiny-Q4_K_M.gguf"].sha256 == sha256(WEIGHTS)
    assert lfs["README.md"] is None
    plain = api.model_info(REPO, revision=hub.commit(REPO))
    assert [s.size for s in plain.siblings or []] == [None, None, None]

    paths = api.get_paths_info(REPO, ["tiny-Q4_K_M.gguf", "sub", "missing.txt"])
    assert [(type(p).__name__, p.path) for p in paths] == [
        ("RepoFile", "tiny-Q4_K_M.gguf"),
        ("RepoFolder", "sub"),
    ]


def test_errors_raise_huggingface_hub_classes(hub: HubServer) -> None:
    with pytest.raises(GatedRepoError):
        hf_hub_download(GATED, "model.gguf")
    assert Path(hf_hub_download(GATED, "model.gguf", token=hub.token)).read_bytes()[:4] == b"GGUF"
    # A gated repo's listing is public, as on the Hub.
    assert huggingface_hub.list_repo_files(GATED) == ["model.gguf"]

    hub.add_repo("acme/private", private=True)
    hub.add_file("acme/private", "a.txt", b"secret")
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("acme/private")
    assert HfApi().model_info("acme/private", token=hub.token).id == "acme/private"

    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/nope", "x.gguf")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.gguf")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "README.md", revision="v9")
    with pytest.raises(HfHubHTTPError) as bad_token:
        HfApi().model_info(REPO, token="hf_wrong")
    assert bad_token.value.response.status_code == 401


def test_range_requests(hub: HubServer) -> None:
    url = hf_hub_url(REPO, "tiny-Q4_K_M.gguf")
    session, headers = get_session(), build_hf_headers()
    r = session.get(url, headers={**headers, "Range": "bytes=10-19"})
    assert r.status_code == 206
    assert r.content == WEIGHTS[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{len(WEIGHTS)}"
    assert r.headers["X-Linked-Etag"] == f'"{sha256(WEIGHTS)}"'
    assert session.get(url, headers={**headers, "Range": "bytes=-5"}).content == WEIGHTS[-5:]
    assert (
        session.get(url, headers={**headers, "Range": f"bytes={len(WEIGHTS) - 3}-"}).content == WEIGHTS[-3:]
    )
    assert session.get(url, headers={**headers, "Range": f"bytes={len(WEIGHTS)}-"}).status_code == 416
    assert hub.bytes_served(REPO, "tiny-Q4_K_M.gguf") == 10 + 5 + 3


def test_head_never_advertises_xet(hub: HubServer) -> None:
    meta = huggingface_hub.get_hf_file_metadata(hf_hub_url(REPO, "tiny-Q4_K_M.gguf"))
    assert meta.xet_file_data is None
    assert meta.etag == sha256(WEIGHTS)
    assert meta.size == len(WEIGHTS)
    assert meta.commit_hash == hub.commit(REPO)
    r = get_session().head(hf_hub_url(REPO, "tiny-Q4_K_M.gguf"))
    assert not [h for h in r.headers if h.lower().startswith("x-xet")]


def test_dropped_connection_is_resumed_by_huggingface_hub(hub: HubServer, tmp_path: Path) -> None:
    # huggingface_hub writes in 10 MiB chunks and resumes from the last whole chunk: drop after 12 MiB.
    big = tmp_path / "big.gguf"
    big.write_bytes(os.urandom(16 * 1024 * 1024))
    hub.add_file(REPO, "big.gguf", big)
    knobs = hub.knobs(REPO, "big.gguf")
    knobs.drop_after, knobs.drop_times = 12 * 1024 * 1024, 1
    path = hf_hub_download(REPO, "big.gguf")
    assert Path(path).read_bytes() == big.read_bytes()
    ranges = [r.range for r in hub.requests if r.method == "GET" and "big.gguf" in r.path]
    assert ranges == [None, f"bytes={10 * 1024 * 1024}-"]
    assert hub.bytes_served(REPO, "big.gguf") == 12 * 1024 * 1024 + 6 * 1024 * 1024
    assert knobs.drop_times == 0


def test_429_then_success(hub: HubServer) -> None:
    knobs = hub.knobs(REPO, "tiny-Q4_K_M.gguf")
    knobs.fail_429_times, knobs.retry_after = 1, 0
    assert Path(hf_hub_download(REPO, "tiny-Q4_K_M.gguf")).read_bytes() == WEIGHTS
    statuses = [r.status for r in hub.requests if r.method == "GET" and "tiny-Q4_K_M" in r.path]
    assert statuses == [429, 200]


def test_corrupt_and_throttled_content(hub: HubServer, tmp_path: Path) -> None:
    knobs = hub.knobs(REPO, "tiny-Q4_K_M.gguf")
    knobs.corrupt = True
    knobs.throttle_bps = 64 * 1024 * 1024
    got = Path(hf_hub_download(REPO, "tiny-Q4_K_M.gguf", local_dir=tmp_path)).read_bytes()
    assert len(got) == len(WEIGHTS)
    assert sha256(got) != sha256(WEIGHTS)
    diff = [i for i in range(len(got)) if got[i] != WEIGHTS[i]]
    assert diff == [len(WEIGHTS) // 2]


def test_new_file_makes_a_new_commit(hub: HubServer) -> None:
    before = hub.commit(REPO)
    hub.add_file(REPO, "notes.txt", "hello")
    assert hub.commit(REPO) != before
    assert HfApi().model_info(REPO).sha == hub.commit(REPO)
    assert Path(hf_hub_download(REPO, "notes.txt")).read_text() == "hello"
