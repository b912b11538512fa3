"""The error a request is refused with, in OpenAI's shape: shared by every route and request parser, and the one
mapping (:func:`api_error`) from what a request path raises to the error the server answers."""

from __future__ import annotations

from typing import Any

from clover_local.errors import CloverError, RequestRefused, RunnerUnavailable


class ApiError(Exception):
    """A request the server refuses, with OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str = "invalid_request_error",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type
        self.retry_after_s = retry_after_s
        """When waiting cures it (a full queue, a runner starting again): the ``Retry-After`` the client gets."""

    def body(self) -> dict[str, Any]:
        return error_body(self.message, code=self.code, param=self.param, type=self.type)


def error_body(
    message: str, *, code: str | None = None, param: str | None = None, type: str = "invalid_request_error"
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def json_object(body: Any) -> dict[str, Any]:
    """``body`` as a JSON object, else a 400."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    return body


REQUEST_ERRORS = (ApiError, CloverError)
"""What a request path catches and hands to :func:`api_error`."""


def api_error(exc: ApiError | CloverError) -> ApiError:
    """``exc`` as the ``ApiError`` the client gets: a request the server refuses as it is, one an engine refuses
    (``RequestRefused``) a 400, a runner that is starting again or gone (``RunnerUnavailable``) a 503 (with
    ``Retry-After`` while it restarts), anything else clover-local reports (``CloverError``) a 500. Each route
    writes the result in its own API's error shape."""
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
