"""Run upstream ``llama-server`` as a child process: start it with a plan's flags, wait until it is ready,
stream its log, stop it cleanly, and never leave it running after clover-local is gone.

The argv comes from the same place as ``clover-local command`` (``plan.llama_args.llama_server_args``), is
fitted to the binary's own ``--help`` (``server_args.fit_argv``), and gets host, port and key added. The child
dies with clover-local and is stopped with its process group (:mod:`.children`); an ``atexit`` hook stops what
is still running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from clover_local.engine.load_log import says_out_of_memory
from clover_local.engine.repack import common_argv_here, repack_safe_here
from clover_local.errors import OutOfMemoryError, ServerError
from clover_local.llamacpp import http_client
from clover_local.llamacpp.binary import Capabilities, ServerBinary, capabilities, find_llama_server
from clover_local.llamacpp.children import Child, bind_error
from clover_local.llamacpp.server_args import fit_argv, with_endpoint, with_slot_save
from clover_local.llamacpp.slot_files import private_slot_dir, remove_slot_dir

if TYPE_CHECKING:
    from clover_local.plan.reasons import Notice
    from clover_local.plan.types import Plan

__all__ = ["LlamaServerProcess", "find_llama_server", "free_port", "plan_server_argv", "start_llama_server"]

LogCallback = Callable[[str], None]
_live: weakref.WeakSet[LlamaServerProcess] = weakref.WeakSet()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _reachable(host: str) -> str:
    """The address to reach (or probe) a server listening on ``host``: a wildcard is reached on loopback."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def plan_server_argv(plan: Plan) -> list[str]:
    """The plan's ``llama-server`` flags (the same ones ``clover-local command`` prints), ``-m`` included."""
    from clover_local.plan.llama_args import llama_server_args

    if not plan.model_path:
        raise ServerError("The plan has no model file yet.", "Download it first: clover-local download.")
    return llama_server_args(plan)


class LlamaServerProcess(Child):
    """One running ``llama-server``. Use :func:`start_llama_server` to make one."""

    name = "llama-server"

    def __init__(
        self,
        binary: ServerBinary,
        argv: list[str],
        *,
        host: str,
        port: int,
        api_key: str | None,
        warnings: tuple[Notice, ...],
        on_log: LogCallback | None,
    ) -> None:
        super().__init__(on_log)
        self.binary = binary
        self.argv = argv
        self.host = host
        self.port = port
        self.api_key = api_key
        self.warnings = warnings
        self.generation = 0
        """How many times a child was started: a request that began under one generation and finds another (or
        its child gone) knows the child it talked to stopped."""
        self.stop_asked = False
        """``stop()`` was called: the child's exit was asked for, so nothing starts it again."""
        self.ready_after_s: float | None = None
        """How long the last start took until ``/health`` said ready (what a client waits while it restarts)."""
        self.last_exit = ""
        """How the previous child stopped (:meth:`exit_summary`), kept when a new one is started."""
        self.slot_save_dir: str | None = None
        """Where the child saves its slots' state (``--slot-save-path``); None: it cannot."""
        self._swap = threading.Lock()
        """Held while :meth:`relaunch` replaces the child (the supervisor waits on it: :meth:`settled`)."""

    @property
    def url(self) -> str:
        return f"http://{_reachable(self.host)}:{self.port}"

    def command_line(self) -> list[str]:
        return [*self.binary.command, *self.argv]

    def _start(self) -> None:
        env = dict(os.environ)
        if self.api_key:
            env["LLAMA_API_KEY"] = self.api_key
        self._spawn(self.command_line(), env)
        self.generation += 1
        _live.add(self)

    def respawn(self, ready_timeout_s: float) -> None:
        """Start the child again after it stopped unasked: the same argv, key and port (another free port when
        a program took that one meanwhile), ready when this returns. Raises as :meth:`wait_ready` does."""
        if self.running:
            raise ServerError("llama-server is still running; it was not started again.")
        if self.stop_asked:
            raise ServerError("llama-server was stopped; it is not started again.")
        self.last_exit = self.exit_summary()
        self._start_again(self.argv, ready_timeout_s)

    def relaunch(self, argv: Sequence[str], ready_timeout_s: float) -> None:
        """Stop the running child on purpose and start one with ``argv`` (the same port, key and log; another
        flag or value, such as its threads), ready when this returns. When the new one does not start, the old
        argv is kept for the supervisor's next start and the error raised: the supervisor sees a stop."""
        with self._swap:
            if self.stop_asked:
                raise ServerError("llama-server was stopped; it is not started again.")
            previous = self.argv
            try:
                self._start_again(argv, ready_timeout_s)
            except BaseException:
                self.argv = previous
                super().stop(10.0)
                raise

    def _start_again(self, argv: Sequence[str], ready_timeout_s: float) -> None:
        """Stop the child (if it still runs) and start one with ``argv``: on its port, or another free one when a
        program took that one meanwhile."""
        super().stop(10.0)  # the child alone: stop_asked stays unset and the slot folder kept
        if bind_error(self.host, self.port) is not None:
            self.port = free_port(_reachable(self.host))
        self.argv = with_endpoint(argv, host=self.host, port=self.port)
        self._start()
        self.wait_ready(ready_timeout_s)
        check_listener(self, self.port)

    def settled(self) -> None:
        """Return once no :meth:`relaunch` is replacing the child."""
        with self._swap:
            return

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``/health`` until it answers 200; raise ``ServerError`` (with the log tail) if the process
        exits or the timeout passes first."""
        started = time.monotonic()
        late = f"llama-server was not ready after {timeout_s:.0f} s. Its last lines:\n"
        fix = "A large model on a slow disk can take longer: raise the timeout."
        self._wait_until(
            self._healthy, timeout_s, self._exited, lambda: ServerError(late + self.log_tail(), fix)
        )
        self.ready_after_s = time.monotonic() - started

    def _healthy(self) -> bool | None:
        try:
            return http_client.request(self.url, "GET", "/health", timeout_s=2.0).status == 200 or None
        except ServerError:
            return None  # not listening yet

    def _exited(self, code: int | None) -> Exception:
        if says_out_of_memory(self.log_tail(40)):
            return OutOfMemoryError(
                f"llama-server ran out of memory while loading (exit code {code}): "
                + _last_error_line(self.log_tail(40))
            )
        return ServerError(
            f"llama-server exited (code {code}) before it was ready. Its last lines:\n" + self.log_tail(),
            "Read the lines above; `clover-local doctor` checks the binary.",
        )

    def wait_exit(self, timeout_s: float | None) -> int | None:
        """The exit code once the server has exited, waiting up to ``timeout_s`` (None: until it exits); None while
        it runs."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def exit_summary(self) -> str:
        """Why the child stopped, in one sentence without its log lines (those can hold a prompt's text and the
        paths of this machine): what API clients and the chat's status are told."""
        from clover_local.rpc.failures import explain_rpc_failure

        code = self._proc.poll() if self._proc is not None else None
        self._join_reader()
        why = explain_rpc_failure(self.log_tail(40), self.argv)
        oom = " after running out of memory" if says_out_of_memory(self.log_tail(40)) else ""
        return f"llama-server stopped (exit code {code}){oom}" + (f": {why}" if why else "")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the server's process group, then SIGKILL after ``timeout_s``; returns the exit code."""
        self.stop_asked = True
        if self._proc is None:
            return None
        code = super().stop(timeout_s)
        remove_slot_dir(self.slot_save_dir)
        _live.discard(self)
        return code


def start_llama_server(
    argv: Sequence[str],
    *,
    binary: ServerBinary,
    api_key: str | None = None,
    on_log: LogCallback | None = None,
    ready_timeout_s: float = 600.0,
    adapt: bool = True,
    keep_slots: bool = False,
) -> LlamaServerProcess:
    """Start ``binary`` (the one the launch chose: nothing is looked for here) with ``argv`` (fitted to the
    binary when ``adapt``: a launch fitted when decided asks nothing; warnings in ``.warnings``) on a free
    loopback port and return once ``/health`` says it is ready. ``keep_slots``: let it save and restore its
    slots' state in a private folder of its own (``--slot-save-path``, where the binary has it; removed when it
    is stopped), so a relaunch keeps the conversations it holds (:attr:`LlamaServerProcess.slot_save_dir`)."""
    warnings: tuple[Notice, ...] = ()
    fitted = common_argv_here(argv)  # whatever machine the plan describes, this CPU runs it
    caps: Capabilities | None = None
    if adapt:
        caps = capabilities(binary.path, binary.subcommand)
        adapted = fit_argv(argv, caps, repack_safe=repack_safe_here())
        fitted, warnings = list(adapted.argv), adapted.warnings
    host, port = "127.0.0.1", free_port()
    if api_key is None:
        # A key of its own, by environment (never argv, which `ps` shows): clover-local's API may require a
        # key, and the child's port must not be a way around it for other local users and processes.
        api_key = secrets.token_urlsafe(32)
    saves = None
    if keep_slots and (
        caps is None or caps.supports("--slot-save-path")
    ):  # decided with its --help, or asked now
        saves = private_slot_dir()
        fitted = with_slot_save(fitted, saves)
    full = with_endpoint(fitted, host=host, port=port)
    server = LlamaServerProcess(
        binary, full, host=host, port=port, api_key=api_key, warnings=warnings, on_log=on_log
    )
    server.slot_save_dir = saves
    server._start()
    try:
        server.wait_ready(ready_timeout_s)
        check_listener(server, port)
    except BaseException:
        server.stop()
        raise
    return server


def check_listener(server: LlamaServerProcess, port: int) -> None:
    """ServerError unless the process listening on ``port`` is this child: another program that took the port
    between choosing and binding it would otherwise answer /health and get every prompt (and our key)."""
    import psutil

    pid = server.pid
    if pid is None:
        raise ServerError("llama-server is not running.")
    try:
        listening = {
            c.laddr.port
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        }
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return  # the OS does not say (some macOS setups): /health answered, as before
    except psutil.NoSuchProcess:
        raise ServerError("llama-server exited right after it was ready:\n" + server.log_tail()) from None
    if port not in listening:
        raise ServerError(
            f"Port {port} answered as llama-server, but the llama-server started here does not listen on it:"
            " another program holds the port.",
            "Find it with `ss -ltnp` (or `lsof -i`), or choose another port.",
        )


def _last_error_line(tail: str) -> str:
    """The log's last line that says memory ran out, else its last error or failure (the whole tail goes to the
    log, not to people)."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    memory = [ln for ln in lines if says_out_of_memory(ln)]
    errors = [ln for ln in lines if "error" in ln.lower() or "fail" in ln.lower()]
    return (memory or errors or lines or ["no details in its log"])[-1]


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop(timeout_s=5.0)
