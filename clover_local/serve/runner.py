"""Run the OpenAI-compatible app with uvicorn: in the foreground (``clover-local serve``) or in a background
thread (tests, benchmarks, the TUI), always on a host and port the caller chose."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from clover_local.engine.types import ChatEngine
from clover_local.errors import RunnerUnavailable, ServerError
from clover_local.serve.api import ApiConfig, OpenAIServer
from clover_local.serve.header_deadline import header_deadline_protocol

MAX_CONNECTIONS = 256
"""Open connections (and requests in progress) served at once; past it new ones get 503 at once, so a flood of
idle or slow connections cannot exhaust the process's file descriptors or memory."""


def _config(api: OpenAIServer, host: str, port: int, log_level: str) -> uvicorn.Config:
    config = api.config
    return uvicorn.Config(
        api.app(),
        host=host,
        port=port,
        log_level=log_level,
        access_log=log_level in ("debug", "info"),
        lifespan="off",
        timeout_graceful_shutdown=5,
        limit_concurrency=MAX_CONNECTIONS,
        http=header_deadline_protocol(config.header_timeout_s),  # h11, with a deadline for the headers
    )


def _bound_port(host: str, port: int) -> int:
    """``port`` (0: a free one), once ``host`` is seen to be able to listen on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ServerError(
                f"Cannot listen on {host}:{port} ({exc.strerror}).",
                "Another program may use that port: choose another with --port.",
            ) from None
        return int(s.getsockname()[1])


GIVEN_UP_CHECK_S = 0.5
"""How often ``serve`` looks whether its runner was given up (a read of the supervisor's state)."""


def serve_forever(
    engine: ChatEngine,
    config: ApiConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    log_level: str = "info",
    keep_serving: bool = False,
) -> None:
    """Serve until Ctrl-C / SIGTERM (uvicorn handles both and finishes open responses), or until the engine's
    runner is given up: then :class:`RunnerUnavailable` says why, so ``serve`` exits non-zero and a process
    manager (systemd's ``Restart=on-failure``, Docker's restart policy) starts it afresh. ``keep_serving``: stay
    up and answer 503 with the reason instead (``/health`` says it)."""
    _bound_port(host, port)
    api = OpenAIServer(engine, config)
    server = uvicorn.Server(_config(api, host, port, log_level))
    stop_watching = threading.Event()
    given_up: list[str] = []

    def watch() -> None:
        """Stop the server once the runner is given up (``RunnerHealth`` ``failed``), keeping the reason: a
        server that answers 503 for ever is never restarted by a process manager, one that exits is."""
        while not stop_watching.wait(GIVEN_UP_CHECK_S):
            health = engine.health()
            if health.state == "failed":
                given_up.append(health.why)
                server.should_exit = True  # open responses are finished, as on SIGTERM
                return

    watcher = threading.Thread(target=watch, name="clover-runner-watch", daemon=True)
    if not keep_serving:
        watcher.start()
    try:
        server.run()
    finally:
        stop_watching.set()
        if watcher.is_alive():
            watcher.join(timeout=5.0)
        api.close()
    if given_up:
        raise RunnerUnavailable(
            f"serve stopped: the model's runner was given up ({given_up[0]}).",
            "A process manager starts serve again (systemd's Restart=on-failure, Docker's restart policy); the "
            "lines above hold the runner's last log, and `clover-local doctor` checks the runtime. With "
            "--keep-serving, serve stays up and answers 503 instead.",
        )


class BackgroundServer:
    """The API served from a daemon thread; ``with BackgroundServer(...) as s: s.url``."""

    def __init__(
        self,
        engine: ChatEngine,
        config: ApiConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
    ) -> None:
        self.host, self.port = host, _bound_port(host, port)
        self._api = OpenAIServer(engine, config)
        self._server = uvicorn.Server(_config(self._api, host, self.port, log_level))
        self._server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.run, name="clover-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ServerError(f"The API server did not start on {self.url}.")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10.0)
        self._api.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
