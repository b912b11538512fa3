"""The error a request is refused with, in OpenAI's shape: shared by every route and request parser."""

from __future__ import annotations

from collections.abc import Container
from typing import Any


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


def json_object(body: Any, *, known: Container[str] | None = None, route: str = "") -> dict[str, Any]:
    """``body`` as a JSON object, else a 400; with ``known``, a key outside it is a named 400 (a field this
    server cannot honour is refused, never silently dropped)."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    if known is not None:
        for key in body:
            if key not in known:
                raise ApiError(
                    400,
                    f"'{key}' is not supported by this server's {route}.",
                    param=key,
                    code="unsupported_parameter",
                )
    return body
