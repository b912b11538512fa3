"""Hostile or mistaken input to the server gets a named 4xx, never a 500 with a traceback, on both engines
(embedded Gemma 3 270M and the built llama-server): lone surrogates, 100,000-deep JSON, fields the engines
would silently ignore, bodies over the size limit. Also: the GGUF's file name is accepted as ``model``."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
from collections.abc import Iterator

import pytest

from clover_local.detect import parse_simulate
from clover_local.launch import LaunchRequest, decide_launch, open_launch
from clover_local.presets import load_preset
from clover_local.serve import request_guard as guard
from clover_local.serve.api import ApiConfig
from clover_local.serve.openai_schema import ApiError
from clover_local.serve.runner import BackgroundServer
from clover_local.testing.models import gemma_path
from tests.helpers_serve import llama_server_path, raw_post

pytestmark = pytest.mark.slow

KEY = "guard-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
USER = {"role": "user", "content": "Say hi."}


class _Tracebacks(logging.Handler):
    """Collects log records that carry an exception (what uvicorn logs for a 500)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


@pytest.fixture(scope="module", params=["embedded", "llama-server"])
def server(request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    kind = request.param
    binary = str(llama_server_path()) if kind == "llama-server" else None
    preset = load_preset("gemma3-270m")
    request = LaunchRequest(preset, str(gemma_path()), ctx=1024, engine=kind, llama_server=binary)
    opened = open_launch(decide_launch(request, machine=parse_simulate("ram=16G,cpu=2")))
    plan = opened.plan
    tracebacks = _Tracebacks()
    logging.getLogger("uvicorn.error").addHandler(tracebacks)
    try:
        with BackgroundServer(opened.engine, ApiConfig.for_model(preset.name, plan.model_path, KEY)) as s:
            s.tracebacks = tracebacks  # type: ignore[attr-defined]
            yield s
            assert tracebacks.records == [], "a request made the server log a traceback"
    finally:
        logging.getLogger("uvicorn.error").removeHandler(tracebacks)
        opened.engine.close()


def post(server: BackgroundServer, body: bytes) -> tuple[int, dict[str, str]]:
    status, answer = raw_post(server.url, "/v1/chat/completions", body, AUTH)
    return status, (answer or {}).get("error", {})


def test_lone_surrogate_is_a_named_400(server: BackgroundServer) -> None:
    status, err = post(server, b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}]}')
    assert status == 400 and err["code"] == "invalid_unicode" and err["param"] == "messages[0].content"


def test_100000_deep_nesting_is_a_named_400(server: BackgroundServer) -> None:
    depth = 100_000
    status, err = post(server, b'{"messages": ' + b"[" * depth + b"]" * depth + b"}")
    assert status == 400 and err["code"] == "invalid_json" and "nests" in err["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("logit_bias", {"42": -100}), ("logprobs", True), ("presence_penalty", 0.5), ("best_of", 3)],
)
def test_unsupported_fields_are_named_not_ignored(
    server: BackgroundServer, field: str, value: object
) -> None:
    status, err = post(server, json.dumps({"messages": [USER], field: value}).encode())
    assert status == 400 and err["code"] == "unsupported_parameter" and err["param"] == field


def test_a_50_mb_body_is_refused_before_it_is_read(server: BackgroundServer) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    conn.putrequest("POST", "/v1/chat/completions")
    for name, value in {**AUTH, "Content-Type": "application/json", "Content-Length": str(50 << 20)}.items():
        conn.putheader(name, value)
    conn.endheaders()
    with contextlib.suppress(OSError):  # the server may already have answered and closed
        conn.send(b'{"messages": [{"role": "user", "content": "' + b"a" * (1 << 20))  # 1 of the 50 MB
    response = conn.getresponse()  # answered without waiting for the other 49 MB
    assert response.status == 413
    assert json.loads(response.read())["error"]["code"] == "request_too_large"
    conn.close()


def test_a_chunked_body_over_the_limit_is_refused(server: BackgroundServer) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    chunks = (b"x" * (1 << 20) for _ in range(guard.MAX_BODY_BYTES // (1 << 20) + 2))
    with contextlib.suppress(OSError):
        headers = {**AUTH, "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=chunks, headers=headers, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413
    conn.close()


def test_the_gguf_file_name_is_a_model_name_and_the_server_still_serves(server: BackgroundServer) -> None:
    for model in (gemma_path().name, gemma_path().stem, "gemma3-270m"):
        body = {"model": model, "messages": [USER], "max_tokens": 4, "temperature": 0}
        status, answer = raw_post(server.url, "/v1/chat/completions", json.dumps(body).encode(), AUTH)
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"] is not None


def test_decode_json_and_unsupported_fields_directly() -> None:
    assert guard.decode_json(b'{"a": [[["ok"]]]}') == {"a": [[["ok"]]]}
    with pytest.raises(ApiError, match="nests"):
        guard.decode_json(b"[" * (guard.MAX_JSON_DEPTH + 1) + b"]" * (guard.MAX_JSON_DEPTH + 1))
    with pytest.raises(ApiError, match="lone surrogate") as err:
        guard.decode_json(b'{"\\udfff": 1}')
    assert err.value.param == "a key"
    for fine in ({"logprobs": False}, {"presence_penalty": 0}, {"logit_bias": {}}, {"modalities": ["text"]}):
        guard.refuse_unsupported(fine)
    with pytest.raises(ApiError):
        guard.refuse_unsupported({"top_logprobs": True})  # true is not 0


def test_model_names_for_a_file() -> None:
    config = ApiConfig.for_model("clover-35b-a3b", "/m/Clover-Q4_K_M.gguf")
    assert config.model_names == ("clover-35b-a3b", "Clover-Q4_K_M.gguf", "Clover-Q4_K_M")
    assert ApiConfig.for_model("p", None).model_names == ("p",)
