"""A release's JSON from the releases API becomes a checked value, or a refusal that names what is wrong: the
tag becomes a folder name and asset names become file names, so nothing else is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from clover_local.errors import RuntimeInstallError
from clover_local.runtimes.releases import parse_release

SHA = "ab" * 32


def _release(**changes: Any) -> dict[str, Any]:
    asset = {
        "name": "llama-b7000-bin-ubuntu-x64.tar.gz",
        "size": 12_345,
        "digest": f"sha256:{SHA}",
        "browser_download_url": "https://github.com/ggml-org/llama.cpp/releases/download/b7000/x.tar.gz",
    }
    payload: dict[str, Any] = {
        "tag_name": "b7000",
        "assets": [asset],
        "tarball_url": "https://api.github.com/repos/ggml-org/llama.cpp/tarball/b7000",
        "published_at": "2026-11-30T12:00:00Z",
    }
    for key, value in changes.items():
        if key.startswith("asset_"):
            asset[key.removeprefix("asset_")] = value
        else:
            payload[key] = value
    return payload


def test_a_release_as_github_describes_it() -> None:
    release = parse_release(_release(), "test")
    assert release.tag == "b7000" and release.number == 7000
    (asset,) = release.assets
    assert (asset.name, asset.size, asset.sha256) == ("llama-b7000-bin-ubuntu-x64.tar.gz", 12_345, SHA)
    assert release.tarball_url and release.asset(asset.name) == asset and release.asset("other") is None


def test_an_asset_without_a_digest_has_none() -> None:
    payload = _release()
    del payload["assets"][0]["digest"]
    assert parse_release(payload, "test").assets[0].sha256 is None
    assert parse_release(_release(asset_digest=None), "test").assets[0].sha256 is None


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ([], "not a JSON object"),
        (_release(tag_name="v1.0"), "is not a llama.cpp tag"),
        (_release(tag_name="b1/../../x"), "is not a llama.cpp tag"),
        (_release(assets={}), "assets is not a list"),
        (_release(asset_name="../evil.tar.gz"), "not a plain file name"),
        (_release(asset_name="sub/dir.tar.gz"), "not a plain file name"),
        (_release(asset_size=-1), "has no size"),
        (_release(asset_size="12"), "has no size"),
        (_release(asset_browser_download_url="file:///etc/passwd"), "no browser_download_url"),
        (_release(asset_digest="md5:abc"), "not sha256:<64 hex>"),
        (_release(asset_digest="sha256:xyz"), "not sha256:<64 hex>"),
        (_release(asset_digest=12), "not a string"),
    ],
)
def test_a_malformed_release_is_refused(payload: object, why: str) -> None:
    with pytest.raises(RuntimeInstallError, match=r"did not answer a llama\.cpp release") as caught:
        parse_release(payload, "test")
    assert why in str(caught.value)
