"""Shared pieces of the serve / llama-server tests: the built llama-server (CI must have one), a recording
wrapper around a real engine, and small raw-HTTP helpers for requests the openai client will not send."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_engine import EngineWrapper

from clover_local import settings
from clover_local.engine.types import (
    ChatEngine,
    Finished,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
)

# Resolved at import, before the autouse fixture points CLOVER_DATA_DIR at a temporary folder.
_REAL_BUILT = settings.llama_server_dir() / "llama-server"
_ENV_BINARY = os.environ.get("CLOVER_LLAMA_SERVER")


def llama_server_path() -> Path:
    """The llama-server to test: CLOVER_LLAMA_SERVER, else the one scripts/build-llama-server installed.

    Without one the test is skipped, except in CI (``CI`` set), where a missing binary is a failure: CI runs
    scripts/build-llama-server before the tests."""
    for candidate in (_ENV_BINARY, str(_REAL_BUILT)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    message = f"no llama-server binary ({_REAL_BUILT}); run scripts/build-llama-server"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must build it before the tests)")
    pytest.skip(message)


class RecordingEngine(EngineWrapper):
    """A real engine, passed through, remembering the stats of each finished generation."""

    def __init__(self, inner: ChatEngine) -> None:
        super().__init__(inner)
        self.finished: list[GenerationStats] = []
        self.started = threading.Event()
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.started.set()
        try:
            for event in self.inner.generate(request, cancel):
                if isinstance(event, Finished):
                    self.finished.append(event.stats)
                yield event
        finally:
            with self._lock:
                self.active -= 1


def raw_post(base_url: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POST raw bytes (for malformed JSON); returns (status, decoded JSON body)."""
    host_port = base_url.removeprefix("http://")
    host, port = host_port.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def start_stream_and_hang_up(
    base_url: str, path: str, payload: dict[str, Any], headers: dict[str, str]
) -> str:
    """Start a streamed request, read its first event with text, then close the socket mid-stream."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json", **headers}
    )
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    try:
        while True:
            line = resp.readline().decode()
            if not line:
                return ""
            if not line.startswith("data:") or "[DONE]" in line:
                continue
            choice = (json.loads(line[5:]).get("choices") or [{}])[0]
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text:
                return str(text)
    finally:
        if conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()


def health(url: str) -> dict[str, Any]:
    """``serve``'s ``/health`` (slots busy/total, the queue)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/health")
        return dict(json.loads(conn.getresponse().read()))
    finally:
        conn.close()


class HeldStream:
    """A streamed request whose first text has arrived and which is then left unread (held open)."""

    def __init__(self, url: str, payload: dict[str, Any]) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self.conn.request(
            "POST", "/v1/completions", body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        self.first = self._next_text()
        assert self.first is not None

    def _next_text(self) -> str | None:
        while True:
            line = self.resp.readline().decode()
            if not line or "[DONE]" in line:
                return None
            if line.startswith("data:"):
                text = (json.loads(line[5:]).get("choices") or [{}])[0].get("text")
                if text:
                    return str(text)

    def hang_up(self) -> None:
        self.conn.close()
