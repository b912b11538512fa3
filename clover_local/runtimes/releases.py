"""llama.cpp releases as GitHub's releases API describes them (``/releases/latest``, ``/releases/tags/<tag>``),
read from ``CLOVER_LLAMACPP_RELEASES`` into plain values.

Everything in an answer is checked before it is used: the tag must be llama.cpp's ``b<digits>`` (it becomes a
folder name), asset names must be plain file names, digests ``sha256:<64 hex>``. An answer that is not that shape
is refused, not guessed at.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass

import httpx2

from clover_local import settings
from clover_local.errors import RuntimeInstallError
from clover_local.runtimes import net
from clover_local.runtimes.installed import valid_tag

MAX_RELEASE_JSON = 4 * 1024 * 1024
"""A release's JSON is a few tens of kB (about 30 assets); anything near this is not a release."""
MAX_SOURCE_FILE = 16 * 1024 * 1024
"""``src/llama-arch.cpp`` and ``common/arg.cpp`` are a few hundred kB."""
_ASSET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_MIRROR_FIX = "Check CLOVER_LLAMACPP_RELEASES points at GitHub's API for llama.cpp or a faithful mirror."


@dataclass(frozen=True)
class ReleaseAsset:
    """One file attached to a release."""

    name: str
    size: int
    sha256: str | None
    """From the asset's ``digest`` (GitHub computes it at upload); None when the server publishes none."""
    url: str
    """``browser_download_url``."""


@dataclass(frozen=True)
class Release:
    tag: str
    assets: tuple[ReleaseAsset, ...]
    tarball_url: str | None
    """The source of this tag as a .tar.gz (GitHub publishes no digest for it)."""
    published: str = ""

    @property
    def number(self) -> int:
        return int(self.tag[1:])

    def asset(self, name: str) -> ReleaseAsset | None:
        return next((a for a in self.assets if a.name == name), None)

    @property
    def asset_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.assets)


def fetch_release(tag: str = "latest", http: httpx2.Client | None = None) -> Release:
    """The release ``tag`` (``latest``: the newest one), from the releases API."""
    if tag != "latest" and not valid_tag(tag):
        raise RuntimeInstallError(
            f"{tag!r} is not a llama.cpp release tag.",
            "Name one like b7000 (see `clover-local runtime list`), or latest.",
        )
    base = settings.llamacpp_releases_url().rstrip("/")
    url = f"{base}/releases/latest" if tag == "latest" else f"{base}/releases/tags/{tag}"
    what = "find the latest llama.cpp release" if tag == "latest" else f"find llama.cpp release {tag}"
    with net.client() if http is None else contextlib.nullcontext(http) as client:
        try:
            body = net.get_bytes(
                client, url, what=what, limit=MAX_RELEASE_JSON, accept="application/vnd.github+json"
            )
        except net.HttpStatusError as exc:
            if exc.status == 404 and tag != "latest":
                raise RuntimeInstallError(
                    f"llama.cpp has no release {tag} ({url} answered 404).",
                    "Check the tag on https://github.com/ggml-org/llama.cpp/releases, or use latest.",
                ) from None
            raise
    try:
        payload = json.loads(body)
    except ValueError:
        raise RuntimeInstallError(
            f"Could not {what}: {url} did not answer JSON (starts {body[:60]!r}).", _MIRROR_FIX
        ) from None
    release = parse_release(payload, url)
    if tag != "latest" and release.tag != tag:
        raise RuntimeInstallError(
            f"Asked {url} for release {tag}, it answered {release.tag}; refusing it.", _MIRROR_FIX
        )
    return release


def source_file_url(tag: str, path: str) -> str:
    """Where one source file of a release is (``CLOVER_LLAMACPP_RAW``/<tag>/<path>)."""
    return f"{settings.llamacpp_raw_url().rstrip('/')}/{tag}/{path}"


def fetch_source_file(tag: str, path: str, http: httpx2.Client | None = None) -> bytes:
    """One source file of release ``tag`` (``src/llama-arch.cpp``: what that release can load), from the raw-file
    base. Small files only (:data:`MAX_SOURCE_FILE`)."""
    if not valid_tag(tag):
        raise RuntimeInstallError(f"{tag!r} is not a llama.cpp release tag.")
    url = source_file_url(tag, path)
    with net.client() if http is None else contextlib.nullcontext(http) as client:
        return net.get_bytes(client, url, what=f"fetch {path} of llama.cpp {tag}", limit=MAX_SOURCE_FILE)


def parse_release(payload: object, source: str) -> Release:
    """A :class:`Release` from one release's JSON; :class:`RuntimeInstallError` when it is not that shape."""
    if not isinstance(payload, dict):
        raise _malformed(source, "not a JSON object")
    tag = payload.get("tag_name")
    if not isinstance(tag, str) or not valid_tag(tag):
        raise _malformed(source, f"tag_name {str(tag)[:40]!r} is not a llama.cpp tag (b<digits>)")
    raw_assets = payload.get("assets", [])
    if not isinstance(raw_assets, list):
        raise _malformed(source, "assets is not a list")
    assets = tuple(_asset(a, source) for a in raw_assets)
    tarball = payload.get("tarball_url")
    published = payload.get("published_at")
    return Release(
        tag=tag,
        assets=assets,
        tarball_url=tarball
        if isinstance(tarball, str) and tarball.startswith(("http://", "https://"))
        else None,
        published=published if isinstance(published, str) else "",
    )


def is_file_name(name: str) -> bool:
    """A plain file name (no folder, no ``..``): what an asset name must be to be written to disk."""
    return bool(_ASSET_NAME.match(name)) and ".." not in name


def _asset(raw: object, source: str) -> ReleaseAsset:
    if not isinstance(raw, dict):
        raise _malformed(source, "an asset is not a JSON object")
    name, size, url = raw.get("name"), raw.get("size"), raw.get("browser_download_url")
    if not isinstance(name, str) or not is_file_name(name):
        raise _malformed(source, f"asset name {str(name)[:60]!r} is not a plain file name")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _malformed(source, f"asset {name} has no size")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise _malformed(source, f"asset {name} has no browser_download_url")
    digest = raw.get("digest")
    sha256 = None
    if isinstance(digest, str):
        match = _DIGEST.match(digest.strip().lower())
        if match is None:
            raise _malformed(
                source, f"asset {name} has a digest that is not sha256:<64 hex> ({digest[:80]!r})"
            )
        sha256 = match.group(1)
    elif digest is not None:
        raise _malformed(source, f"asset {name} has a digest that is not a string")
    return ReleaseAsset(name=name, size=size, sha256=sha256, url=url)


def _malformed(source: str, why: str) -> RuntimeInstallError:
    return RuntimeInstallError(f"{source} did not answer a llama.cpp release: {why}.", _MIRROR_FIX)
