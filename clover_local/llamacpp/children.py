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
from collections.abc import Callable
from typing import Any

from clover_local.errors import ServerError

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


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to the child's process group (the child alone if the group is gone)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the child's process group, SIGKILL after ``timeout_s``."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=5.0)


def read_log(
    name: str,
    proc: subprocess.Popen[bytes],
    tail: collections.deque[str],
    on_log: Callable[[str], None] | None,
    each: Callable[[str], None] | None = None,
) -> threading.Thread:
    """A started thread that reads the child's output to its end, a line at a time, into ``tail``, ``each`` and
    ``on_log`` (whose errors are swallowed: a broken log view must not stop the child's log pipe)."""

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            tail.append(line)
            if each is not None:
                each(line)
            if on_log is not None:
                with contextlib.suppress(Exception):
                    on_log(line)

    reader = threading.Thread(target=read, name=f"{name}-log", daemon=True)
    reader.start()
    return reader


def bind_error(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be listened on now; None when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc
    return None
