"""The OpenAI-compatible server over the real embedded engine (Gemma 3 270M), driven by the official openai
client, plus raw HTTP for what that client will not send (malformed JSON, a hang-up mid-stream)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import openai
import pytest
from helpers_engine import SLOW_TOKEN_S, GatedEngine, ScriptedEngine
from helpers_serve import RecordingEngine, raw_post, start_stream_and_hang_up
from waiting import wait_until

from clover_local.engine.loader import load_engine
from clover_local.plan.types import SpeculativePlan
from clover_local.presets import load_preset
from clover_local.serve.api import ApiConfig, bind_warning
from clover_local.serve.runner import BackgroundServer
from clover_local.testing.models import gemma_path
from clover_local.testing.settings import engine_settings

pytestmark = pytest.mark.slow

KEY = "test-key-123"
MODEL = "gemma3-270m"
CTX = 1024
COPY_PROMPT = (
    "Original file:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    "The same file after renaming add to plus:\n```python\n"
)


@pytest.fixture(scope="module")
def engine() -> Iterator[RecordingEngine]:
    preset = load_preset(MODEL)
    result = load_engine(
        gemma_path(),
        engine_settings(gemma_path(), ctx=CTX, n_batch=512),
        chat_template=preset.chat_template,
        sampling=preset.sampling,
        speculative=SpeculativePlan(enabled=True),
    )
    recording = RecordingEngine(GatedEngine(result.engine, holds=0))  # the hang-up tests arm the gate
    yield recording
    recording.close()


@pytest.fixture(scope="module")
def server(engine: RecordingEngine) -> Iterator[BackgroundServer]:
    with BackgroundServer(engine, ApiConfig(MODEL, aliases=("gemma",), api_key=KEY)) as s:
        yield s


@pytest.fixture
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(params=["gemma", "instant", "slow"])
def held_server(request: pytest.FixtureRequest) -> Iterator[tuple[BackgroundServer, RecordingEngine]]:
    """A server whose next reply waits after its first piece of text until it is cancelled: the client's hang-up
    then lands mid-reply however fast the machine is. On the real Gemma 3 270M, and on the scripted engine at
    once and slowly (``any_speed_engine``'s speeds)."""
    if request.param == "gemma":
        engine: RecordingEngine = request.getfixturevalue("engine")
        gate = engine.inner
        assert isinstance(gate, GatedEngine)
        gate.arm()
        try:
            yield request.getfixturevalue("server"), engine
        finally:
            gate.arm(holds=0)
            gate.release()
        return
    scripted = ScriptedEngine(delay_s=0.0 if request.param == "instant" else SLOW_TOKEN_S)
    recording = RecordingEngine(GatedEngine(scripted))
    with BackgroundServer(recording, ApiConfig(MODEL, api_key=KEY)) as s:
        yield s, recording


@pytest.fixture
def held_client(held_server: tuple[BackgroundServer, RecordingEngine]) -> openai.OpenAI:
    return openai.OpenAI(base_url=held_server[0].url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_chat_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 12
    assert reply.usage.prompt_tokens > 3
    assert reply.model == MODEL


# Compared replies evaluate their prompts from scratch: then they run the same computation, and are the same on
# any CPU (with a cached prefix the rest of the prompt is evaluated in other batches, and a near-tie can flip).
FRESH = {"cache_prompt": False}


def test_streamed_chat_matches_unstreamed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": COPY_PROMPT}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0, extra_body=FRESH
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=FRESH,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    assert usage and usage[-1].completion_tokens == whole.usage.completion_tokens


def test_text_completion_copies_code(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt=COPY_PROMPT, max_tokens=20, temperature=0, stop=["```"], extra_body=FRESH
    )
    assert "(a, b):\n    return a + b" in reply.choices[0].text
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL,
            prompt=COPY_PROMPT,
            max_tokens=20,
            temperature=0,
            stop=["```"],
            stream=True,
            extra_body=FRESH,
        )
        if c.choices
    )
    assert streamed == reply.choices[0].text


def test_cache_prompt_false_evaluates_the_prompt_again(client: openai.OpenAI) -> None:
    """llama-server's ``cache_prompt`` extension: false reuses nothing of the cache, and the reply is what a
    fresh start writes."""

    def ask(**extra: object) -> tuple[str, int]:
        reply = client.completions.create(
            model=MODEL, prompt=COPY_PROMPT, max_tokens=12, temperature=0, stop=["```"], extra_body=extra
        )
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        return reply.choices[0].text, reply.usage.prompt_tokens_details.cached_tokens or 0

    ask()
    warm_text, warm_cached = ask()
    cold_text, cold_cached = ask(cache_prompt=False)
    assert warm_cached > 10 and cold_cached == 0
    assert "(a, b):" in cold_text and "(a, b):" in warm_text


def test_alias_is_accepted_and_models_lists_both(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL, "gemma"]
    reply = client.completions.create(model="gemma", prompt="One, two,", max_tokens=3)
    assert reply.choices[0].text


def test_api_key_refused_then_accepted(server: BackgroundServer) -> None:
    for key in ("wrong", ""):
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key=key or "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            bad.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert err.value.status_code == 401
        assert err.value.body["code"] == "invalid_api_key"
    status, body = raw_post(server.url, "/v1/completions", b'{"prompt": "x"}')
    assert status == 401 and body["error"]["type"] == "invalid_request_error"
    good = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert good.models.list().data[0].id == MODEL


def test_health_needs_the_key_too(server: BackgroundServer) -> None:
    import http.client

    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.request("GET", "/health")
    refused = conn.getresponse()
    assert refused.status == 401 and b"invalid_api_key" in refused.read()
    conn.request("GET", "/health", headers={"Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200 and b'"ok"' in resp.read()
    conn.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize(
    ("path", "body", "code_or_param"),
    [
        ("/v1/chat/completions", b"{not json", "invalid_json"),
        ("/v1/chat/completions", b"[1, 2]", "invalid_json"),
        ("/v1/chat/completions", b'{"model": "gemma3-270m", "messages": []}', "messages"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "tool", "content": "x"}]}',
            "messages[0].tool_call_id",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            "max_tokens",
        ),
        ("/v1/completions", b'{"prompt": 5}', "prompt"),
        ("/v1/completions", b'{"prompt": "x", "temperature": "hot"}', "temperature"),
        ("/v1/completions", b'{"prompt": "x", "cache_prompt": "no"}', "cache_prompt"),
    ],
)
def test_bad_requests_get_clear_400s(
    server: BackgroundServer, path: str, body: bytes, code_or_param: str
) -> None:
    status, answer = raw_post(server.url, path, body, AUTH)
    assert status == 400
    err = answer["error"]
    assert code_or_param in (err["code"], err["param"])
    assert err["message"]


def test_unknown_model_and_too_long_prompt(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "model_not_found"
    assert "gpt-4o" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="word " * (CTX + 50), max_tokens=4)
    assert err.value.body["code"] == "context_length_exceeded"
    assert str(CTX) in err.value.body["message"]
    # ...and the server goes on serving.
    assert client.completions.create(model=MODEL, prompt="Hello", max_tokens=2).choices[0].text is not None


def test_client_hang_up_cancels_generation_and_server_keeps_serving(
    held_server: tuple[BackgroundServer, RecordingEngine], held_client: openai.OpenAI
) -> None:
    server, engine = held_server
    client = held_client
    before = len(engine.finished)
    payload = {"model": MODEL, "prompt": "Count: one, two, three,", "max_tokens": 600, "stream": True}
    first = start_stream_and_hang_up(server.url, "/v1/completions", payload, AUTH)
    assert first
    wait_until(lambda: len(engine.finished) > before, what="the hung-up generation to end")
    stats = engine.finished[-1]
    assert stats.finish_reason == "cancelled"
    assert stats.completion_tokens < 600
    reply = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4)
    assert reply.choices[0].text


def test_requests_run_one_at_a_time(client: openai.OpenAI, engine: RecordingEngine) -> None:
    engine.max_active = 0
    results: list[str] = []

    def ask(i: int) -> None:
        reply = client.completions.create(model=MODEL, prompt=f"{i} plus {i} is", max_tokens=6)
        results.append(reply.choices[0].text)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 3
    assert engine.max_active == 1


def test_unknown_route_is_openai_shaped(server: BackgroundServer) -> None:
    status, body = raw_post(server.url, "/v1/audio/speech", b"{}", AUTH)
    assert status == 404
    assert body["error"]["code"] == "not_found"


def test_bind_warning_only_for_open_binds_without_key() -> None:
    assert bind_warning("127.0.0.1", None) is None
    assert bind_warning("0.0.0.0", "k") is None
    warning = bind_warning("0.0.0.0", None)
    assert warning is not None and "--api-key" in warning


def test_hang_up_on_a_non_streamed_request_cancels_it_too(
    held_server: tuple[BackgroundServer, RecordingEngine], held_client: openai.OpenAI
) -> None:
    import json
    import socket

    server, engine = held_server
    client = held_client
    before = len(engine.finished)
    engine.started.clear()
    body = json.dumps({"model": MODEL, "prompt": "A, B, C,", "max_tokens": 600}).encode()
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(engine.started.is_set, what="the generation to start")
    wait_until(lambda: len(engine.finished) > before, what="the abandoned generation to end")
    assert engine.finished[-1].finish_reason == "cancelled"
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text is not None
