"""Talking to the Hugging Face Hub through huggingface_hub: list a repo, ask for one file's download
location, and turn every failure into a :class:`DownloadError` a person can act on.

:func:`with_hub_errors` (with :func:`hub_error` and :func:`network_error`) is the one place Hub failures
become messages: downloads and remote GGUF header reads (:mod:`clover_local.fetch.remote_header`) both go through it.

The endpoint, token and offline switch are huggingface_hub's own (``HF_ENDPOINT``, ``HF_TOKEN`` or
``hf auth login``, ``HF_HUB_OFFLINE``), read when called so tests and the TUI can change them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlparse

import httpx2
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import get_hf_file_metadata
from huggingface_hub.utils import build_hf_headers

from clover_local.errors import DownloadError, HubUnreachableError
from clover_local.fetch import cache

T = TypeVar("T")

RATE_LIMIT_RETRIES = 5
"""How many times a 429 (or 503) answer is retried before giving up."""
MAX_RETRY_WAIT_S = 60.0
"""Longest wait between retries, whatever ``Retry-After`` asks: a person is watching."""

NETWORK_ERRORS: tuple[type[BaseException], ...] = (httpx2.TransportError, OfflineModeIsEnabled)
_AUTH_FIX = (
    "Log in with `hf auth login` (or set HF_TOKEN to a token from https://huggingface.co/settings/tokens)"
    " with access to this repo; for a gated repo, first accept its terms on the repo's page."
)


@dataclass(frozen=True)
class RepoEntry:
    """One file of a repo listing."""

    path: str
    size: int
    sha256: str | None
    """The LFS sha256 (what the file's bytes must hash to); None for small non-LFS files."""
    blob_id: str | None
    """The git blob id; huggingface_hub's etag for non-LFS files."""

    @property
    def etag(self) -> str | None:
        """The name huggingface_hub gives the blob in its cache."""
        return self.sha256 or self.blob_id


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str
    entries: tuple[RepoEntry, ...]


@dataclass(frozen=True)
class FileLocation:
    """Where to GET one file's bytes, and with which headers."""

    url: str
    etag: str
    size: int
    commit: str
    headers: dict[str, str]


def endpoint() -> str:
    return constants.ENDPOINT.rstrip("/")


def list_repo(
    repo: str, revision: str, *, timeout_s: float | None = None, retries: int = RATE_LIMIT_RETRIES
) -> RepoListing:
    """List every file of ``repo`` at ``revision`` with sizes and sha256 (one API call, retried on 429).

    ``timeout_s`` bounds each network wait (None: wait as long as the Hub takes, huggingface_hub's default
    for API calls); ``retries`` how many 429/503 answers are waited out."""

    def call() -> RepoListing:
        info = HfApi(endpoint=endpoint()).model_info(
            repo, revision=revision, files_metadata=True, timeout=timeout_s
        )
        entries = tuple(
            RepoEntry(
                path=s.rfilename,
                size=int(s.lfs.size if s.lfs else (s.size or 0)),
                sha256=s.lfs.sha256 if s.lfs else None,
                blob_id=s.blob_id,
            )
            for s in info.siblings or ()
        )
        if not info.sha:
            raise DownloadError(f"The Hub did not say which commit {repo}@{revision} is.")
        return RepoListing(repo=repo, commit=cache.check_commit(info.sha), entries=entries)

    return with_hub_errors(call, repo=repo, what=f"list {repo}", retries=retries)


def locate_file(repo: str, commit: str, filename: str) -> FileLocation:
    """Ask the Hub (HEAD on the resolve URL) where a file's bytes are, its etag and size.

    For Xet-backed files the Hub redirects to a URL that serves the bytes with Range support, so the
    same plain-HTTP path resumes for both storages.
    """
    url = f"{endpoint()}/{repo}/resolve/{quote(commit, safe='')}/{quote(filename)}"

    def call() -> FileLocation:
        headers = build_hf_headers()
        meta = get_hf_file_metadata(url, headers=headers, endpoint=endpoint())
        if meta.etag is None or meta.size is None:
            raise DownloadError(
                f"The Hub's answer for {repo}/{filename} lacks an ETag or size.",
                "Check HF_ENDPOINT points at a Hugging Face Hub (or a faithful mirror).",
            )
        location = meta.location or url
        return FileLocation(
            url=location,
            etag=cache.check_etag(meta.etag),
            size=meta.size,
            commit=cache.check_commit(meta.commit_hash or commit),
            headers={**headers_for(location), "Accept-Encoding": "identity"},
        )

    return with_hub_errors(call, repo=repo, what=f"locate {filename} in {repo}")


def headers_for(url: str, token: str | bool | None = None) -> dict[str, str]:
    """huggingface_hub's request headers for ``url``, with the token only when ``url`` is on the endpoint
    itself: a redirect target (a CDN's signed URL, wherever a mirror points) never gets ``Authorization``.

    The one place that decides where the token goes, for downloads and header reads alike."""
    headers = build_hf_headers(token=token)
    if _origin(url) != _origin(endpoint()):
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    return headers


def _origin(url: str) -> tuple[str, str]:
    parts = urlparse(url)
    return parts.scheme.lower(), parts.netloc.lower()


def with_hub_errors(
    call: Callable[[], T],
    *,
    repo: str,
    what: str,
    filename: str | None = None,
    retries: int = RATE_LIMIT_RETRIES,
) -> T:
    """Run one Hub call: retry 429/503 with backoff (honouring ``Retry-After``, bounded) up to ``retries``
    times, and turn huggingface_hub's exceptions into :class:`DownloadError` messages for people.

    ``what`` completes "Could not ..." in messages; ``filename`` (the repo file the call is about) lets a
    404 name the missing file."""
    for attempt in range(retries + 1):
        try:
            return call()
        except HfHubHTTPError as exc:
            delay = retry_delay_s(exc, attempt, retries)
            if delay is None:
                raise hub_error(exc, repo=repo, what=what, filename=filename, retries=retries) from None
            time.sleep(delay)
        except NETWORK_ERRORS as exc:
            raise network_error(exc, what=what) from None
    raise AssertionError("unreachable")


def retry_delay_s(exc: HfHubHTTPError, attempt: int, retries: int) -> float | None:
    """Seconds to wait before retry ``attempt`` (0-based) of a 429/503 answer (None: another answer, or ``retries``
    spent): ``Retry-After`` when given, else 1 s doubling; at most :data:`MAX_RETRY_WAIT_S`."""
    status = exc.response.status_code if exc.response is not None else None
    if status not in (429, 503) or attempt >= retries:
        return None
    backoff = min(2.0**attempt, MAX_RETRY_WAIT_S)
    value = exc.response.headers.get("Retry-After") if exc.response is not None else None
    try:
        asked = max(float(value), 0.0) if value is not None else backoff
    except ValueError:
        asked = backoff
    return min(asked, MAX_RETRY_WAIT_S)


def hub_error(
    exc: HfHubHTTPError | BaseException,
    *,
    repo: str,
    what: str,
    filename: str | None = None,
    retries: int = RATE_LIMIT_RETRIES,
) -> DownloadError:
    """A person-readable error for an HTTP error from the Hub, or for the network (:func:`network_error`)."""
    if not isinstance(exc, HfHubHTTPError):
        return network_error(exc, what=what)
    status = exc.response.status_code if exc.response is not None else None
    if isinstance(exc, GatedRepoError):
        return DownloadError(
            f"{repo} is a gated repo: Hugging Face wants to know who downloads it.", _AUTH_FIX
        )
    if isinstance(exc, RevisionNotFoundError):
        return DownloadError(f"{repo} has no such revision: no branch, tag or commit by that name.")
    if isinstance(exc, RemoteEntryNotFoundError):
        if filename:
            return DownloadError(
                f"Could not {what}: there is no file {filename} in {repo} (404).",
                "List the repo's files (on its Hub page) to find the right name.",
            )
        return DownloadError(f"Could not {what}: the file is not in the repo (404).")
    if isinstance(exc, RepositoryNotFoundError) or status == 401:
        return DownloadError(
            f"Repository {repo} was not found on {endpoint()}: the Hub has no model {repo!r}, or it is"
            " private and needs a token.",
            "Check the name (org/name, as in its URL). If it is private or gated: " + _AUTH_FIX,
        )
    if status == 403:
        return DownloadError(f"Hugging Face refused access to {repo} (403).", _AUTH_FIX)
    if status == 429:
        return DownloadError(
            "Hugging Face is rate-limiting this machine (429)"
            + (f" and still did after {retries} retries." if retries else "."),
            "Wait a few minutes and run the same command again; logging in (`hf auth login`) raises the limits.",
        )
    if status is not None and status >= 500:
        return DownloadError(
            f"Hugging Face had a server error ({status}) while trying to {what}.", "Try again in a while."
        )
    return DownloadError(f"Could not {what}: {exc}")


def network_error(exc: BaseException, *, what: str) -> HubUnreachableError:
    if isinstance(exc, OfflineModeIsEnabled):
        return HubUnreachableError(
            f"Cannot {what}: offline mode is on (HF_HUB_OFFLINE=1) and the files are not in the cache.",
            "Unset HF_HUB_OFFLINE and connect to the internet, or pick a model already downloaded"
            " (`clover-local models`).",
        )
    return HubUnreachableError(
        f"Could not reach the Hub to {what}: {endpoint()} is unreachable ({type(exc).__name__}: {exc}).",
        "Check your internet connection (and HF_ENDPOINT or proxy settings); files already downloaded"
        " still work offline.",
    )
