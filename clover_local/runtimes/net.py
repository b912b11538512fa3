"""HTTP for runtimes: the releases API, release assets and raw source files, and every failure turned into a
:class:`RuntimeInstallError` a person can act on.

Redirects are followed here, one hop at a time, so the optional GitHub token goes only to the releases API's own
origin (scheme, host, port), never to the CDN a download is redirected to. The offline switch is the project's
(``HF_HUB_OFFLINE``): with it set nothing is asked of any server.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from urllib.parse import urljoin, urlsplit

import httpx2

from clover_local import __version__, settings
from clover_local.errors import RuntimeInstallError

MAX_REDIRECTS = 8
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0
_REDIRECTS = {301, 302, 303, 307, 308}
_TOKEN_FIX = (
    "Set GITHUB_TOKEN to a GitHub token (any, no scopes needed) to raise the limit, or wait and run it again."
)


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


def headers_for(url: str, *, accept: str = "*/*") -> dict[str, str]:
    """The headers of one request: the token only when ``url`` is on the releases API's own origin."""
    headers = {"User-Agent": f"clover-local/{__version__}", "Accept": accept}
    token = settings.github_token()
    if token and origin(url) == origin(settings.llamacpp_releases_url()):
        headers["Authorization"] = f"Bearer {token}"
    return headers


def check_online(what: str) -> None:
    if settings.hf_offline():
        raise RuntimeInstallError(
            f"Cannot {what}: offline mode is on (HF_HUB_OFFLINE is set).",
            "Unset HF_HUB_OFFLINE and connect to the internet; installed runtimes keep working offline"
            " (`clover-local runtime list`).",
        )


def client(timeout_s: float | None = None) -> httpx2.Client:
    """The client every runtimes request goes through (redirects left to :func:`open_stream`); ``timeout_s``
    bounds connecting and each read (default: :data:`CONNECT_TIMEOUT_S`, :data:`READ_TIMEOUT_S`)."""
    read, connect = (READ_TIMEOUT_S, CONNECT_TIMEOUT_S) if timeout_s is None else (timeout_s, timeout_s)
    return httpx2.Client(
        timeout=httpx2.Timeout(read, connect=connect),
        follow_redirects=False,
        trust_env=True,
    )


@contextlib.contextmanager
def open_stream(
    http: httpx2.Client, url: str, *, what: str, accept: str = "*/*", extra: dict[str, str] | None = None
) -> Iterator[httpx2.Response]:
    """A GET of ``url`` (redirects followed, headers chosen per hop), its status checked: 2xx, or 416 when a
    ``Range`` was asked for (the caller decides what that means)."""
    check_online(what)
    for _ in range(MAX_REDIRECTS + 1):
        headers = {**headers_for(url, accept=accept), **(extra or {})}
        answered = False
        try:
            with http.stream("GET", url, headers=headers) as response:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code >= 400 and not (
                    response.status_code == 416 and extra and "Range" in extra
                ):
                    response.read()
                    raise http_error(response, url, what=what)
                answered = True
                yield response  # a connection that breaks while the body arrives is the caller's to handle
                return
        except httpx2.TransportError as exc:
            if answered:
                raise
            raise network_error(exc, url, what=what) from None
    raise RuntimeInstallError(f"Could not {what}: {url} redirected more than {MAX_REDIRECTS} times.")


def get_bytes(http: httpx2.Client, url: str, *, what: str, limit: int, accept: str = "*/*") -> bytes:
    """The whole body of a small GET, refused past ``limit`` bytes."""
    with open_stream(http, url, what=what, accept=accept) as response:
        chunks: list[bytes] = []
        got = 0
        try:
            for chunk in response.iter_bytes():
                got += len(chunk)
                if got > limit:
                    raise RuntimeInstallError(
                        f"Could not {what}: {url} sent more than {limit} bytes; refusing it.",
                        "Check CLOVER_LLAMACPP_RELEASES / CLOVER_LLAMACPP_RAW point at GitHub or a faithful mirror.",
                    )
                chunks.append(chunk)
        except httpx2.TransportError as exc:
            raise network_error(exc, url, what=what) from None
        return b"".join(chunks)


class HttpStatusError(RuntimeInstallError):
    """A server answered an error status (kept in ``status``)."""

    def __init__(self, what: str, fix: str | None = None, *, status: int) -> None:
        super().__init__(what, fix)
        self.status = status


def http_error(response: httpx2.Response, url: str, *, what: str) -> HttpStatusError:
    """A person-readable error for an HTTP error answer (rate limits said as such)."""
    status = response.status_code
    host = urlsplit(url).netloc
    remaining = response.headers.get("x-ratelimit-remaining")
    if status == 429 or (status == 403 and (remaining == "0" or "rate limit" in response.text.lower())):
        reset = response.headers.get("x-ratelimit-reset")
        when = ""
        if reset and reset.isdigit():
            when = f" until {time.strftime('%H:%M:%S', time.localtime(int(reset)))}"
        return HttpStatusError(
            f"Could not {what}: {host} is rate-limiting this machine ({status}){when}.",
            _TOKEN_FIX,
            status=status,
        )
    if status in (401, 403):
        return HttpStatusError(
            f"Could not {what}: {host} refused access ({status}).",
            "Check GITHUB_TOKEN (a wrong or expired token is refused), or unset it.",
            status=status,
        )
    if status == 404:
        return HttpStatusError(f"Could not {what}: {url} does not exist (404).", status=status)
    if status >= 500:
        return HttpStatusError(
            f"Could not {what}: {host} had a server error ({status}).", "Try again in a while.", status=status
        )
    return HttpStatusError(f"Could not {what}: {host} answered {status} for {url}.", status=status)


def network_error(exc: BaseException, url: str, *, what: str) -> RuntimeInstallError:
    host = urlsplit(url).netloc or url
    if isinstance(exc, httpx2.TimeoutException):
        why = "it did not answer in time"
    elif isinstance(exc, httpx2.ConnectError):
        why = "the connection failed (no network, the name does not resolve, or nothing listens there)"
    else:
        why = "the connection broke"
    return RuntimeInstallError(
        f"Could not {what}: {host} is unreachable: {why} ({type(exc).__name__}: {exc}).",
        "Check the internet connection (and CLOVER_LLAMACPP_RELEASES, CLOVER_LLAMACPP_RAW or proxy settings);"
        " installed runtimes keep working offline.",
    )
