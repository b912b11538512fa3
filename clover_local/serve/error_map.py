"""The one mapping from what a request path raises to the error the server answers: a request the server
refuses (``ApiError``), one an engine refuses (``RequestRefused``: 400), a runner that is starting again or gone
(``RunnerUnavailable``: 503, with ``Retry-After`` while it restarts), and anything else clover-local reports
(``CloverError``: 500). Each route writes the result in its own API's error shape."""

from __future__ import annotations

from clover_local.errors import CloverError, RequestRefused, RunnerUnavailable
from clover_local.serve.api_errors import ApiError

REQUEST_ERRORS = (ApiError, CloverError)
"""What a request path catches and hands to :func:`api_error`."""


def api_error(exc: ApiError | CloverError) -> ApiError:
    """``exc`` as the ``ApiError`` the client gets."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestRefused):
        return ApiError(400, str(exc), code="request_refused")
    if isinstance(exc, RunnerUnavailable):
        words = f"{exc.what} {exc.fix}" if exc.fix else exc.what  # one line: clients show one
        return ApiError(
            503, words, code="model_unavailable", type="server_error", retry_after_s=exc.retry_after_s
        )
    return ApiError(500, str(exc), type="server_error")
