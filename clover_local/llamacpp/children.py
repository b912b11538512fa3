"""Child processes (llama-server, rpc-server) that die with clover-local and are stopped as a group.

Each child runs in its own session (its process group is signalled as a whole) and, on Linux, gets
``PR_SET_PDEATHSIG`` so that it is killed even when clover-local dies by ``kill -9``. That signal fires when the
*thread* that forked the child exits, so children are forked from one thread that lives as long as the process
(the TUI starts engines from short-lived worker threads).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar

from clover_local.errors import ServerError

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "CLOVER_API_KEY")
"""Variables no child inherits: clover-local downloads models itself and checks its own API key, so
llama-server and rpc-server never need them, and a child's environment is readable wherever the child is
(``/proc/<pid>/environ`` to its user, core dumps, crash reports)."""

_libc: Any = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        _libc = None


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec: only async-signal-safe calls
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(1)

    return setup


def _popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent(os.getpid()) if _libc is not None else None,
    )


_spawn_queue: queue.Queue[tuple[list[str], dict[str, str], queue.Queue[Any]]] = queue.Queue()
_spawner_lock = threading.Lock()
_spawner: threading.Thread | None = None


def _spawner_loop() -> None:
    while True:
        cmd, env, reply = _spawn_queue.get()
        try:
            reply.put(_popen(cmd, env))
        except BaseException as exc:
            reply.put(exc)


def spawn_child(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Popen from a thread that lives as long as the process, with ``env`` less :data:`SECRET_ENV`.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits, so a child started from a
    short-lived worker thread (the TUI loads engines in workers) would be killed when that worker ends."""
    global _spawner
    env = {k: v for k, v in env.items() if k not in SECRET_ENV}
    if threading.current_thread() is threading.main_thread() or _libc is None:
        try:
            return _popen(cmd, env)
        except OSError as exc:
            raise ServerError(f"Could not start {cmd[0]}: {exc.strerror}.") from None
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawner_loop, name="child-spawner", daemon=True)
            _spawner.start()
    reply: queue.Queue[Any] = queue.Queue()
    _spawn_queue.put((cmd, env, reply))
    result = reply.get()
    if isinstance(result, BaseException):
        raise ServerError(f"Could not start {cmd[0]}: {result}.") from None
    return result  # type: ignore[no-any-return]


def bind_error(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be listened on now; None when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc
    return None


class Child:
    """A child process (:func:`spawn_child`) whose output is read into a tail of its last lines, stopped with its
    process group."""

    name = "child"
    shown_lines = 30
    """How many of its last lines :meth:`log_tail` gives unless asked for another number."""

    def __init__(self, on_log: Callable[[str], None] | None) -> None:
        self._on_log = on_log
        self._tail: collections.deque[str] = collections.deque(maxlen=200)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, n: int | None = None) -> str:
        return "\n".join(list(self._tail)[-(self.shown_lines if n is None else n) :])

    def _spawn(self, cmd: list[str], env: dict[str, str], each: Callable[[str], None] | None = None) -> None:
        """Start the child, and a thread that reads its output to its end, a line at a time, into the tail,
        ``each`` and ``on_log`` (whose errors are swallowed: a broken log view must not stop the log pipe)."""
        self._tail.clear()  # a restarted child's log is its own: an old tail would explain the wrong exit
        proc = self._proc = spawn_child(cmd, env)

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", errors="replace").rstrip()
                self._tail.append(line)
                if each is not None:
                    each(line)
                if self._on_log is not None:
                    with contextlib.suppress(Exception):
                        self._on_log(line)

        self._reader = threading.Thread(target=read, name=f"{self.name}-log", daemon=True)
        self._reader.start()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=2.0)

    def _wait_until(
        self,
        answer: Callable[[], T | None],
        timeout_s: float,
        exited: Callable[[int | None], Exception],
        late: Callable[[], Exception],
    ) -> T:
        """Ask ``answer`` every 0.2 s until it gives something; raise ``exited(exit code)`` if the child exits
        first, or stop it and raise ``late()`` once ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running:
                code = self._proc.returncode if self._proc else None
                self._join_reader()
                raise exited(code)
            found = answer()
            if found is not None:
                return found
            if time.monotonic() > deadline:
                self.stop()
                raise late()
            time.sleep(0.2)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the child's process group, then SIGKILL after ``timeout_s``; returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait(timeout=5.0)
        self._join_reader()
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def _signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child's process group (the child alone if the group is gone)."""
        assert self._proc is not None
        try:
            os.killpg(self._proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
