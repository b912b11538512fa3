"""A ``llama-server`` child watched and started again when it stops unasked (a CUDA error, the OOM killer, a
driver reset, ``kill -9``), with the same argv, key and port, after a back-off, until it keeps stopping
(``restart_policy``). Its last log lines go to the log (``clover_local.runner``: ``serve`` prints it, the app
writes it to its log file), never into an API body or the chat; what people see is :class:`RunnerHealth`."""

from __future__ import annotations

import logging
import threading
import time

from clover_local.engine.types import RunnerHealth
from clover_local.errors import OutOfMemoryError, ServerError
from clover_local.llamacpp.restart_policy import RestartPolicy, next_restart
from clover_local.llamacpp.server import LlamaServerProcess

log = logging.getLogger("clover_local.runner")
LOG_LINES = 20
"""The dead child's last lines written to the log."""
HISTORY = 50


class Supervisor:
    """Watches one :class:`LlamaServerProcess` from a thread of its own."""

    def __init__(
        self,
        process: LlamaServerProcess,
        *,
        policy: RestartPolicy,
        ready_timeout_s: float,
    ) -> None:
        self.process = process
        self.policy = policy
        self.ready_timeout_s = ready_timeout_s
        self.health = RunnerHealth()
        """Where the child stands now."""
        self._stops: list[float] = []
        self._closing = threading.Event()
        self._wake = threading.Event()
        self.history: list[RunnerHealth] = []
        """Every state it went through, in order (the last :data:`HISTORY` of them)."""
        self._thread = threading.Thread(target=self._watch, name="llama-server-supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def restart_now(self) -> None:
        """Cut the back-off short: a runner waiting to start again starts now (the app's "try again")."""
        self._wake.set()

    def close(self) -> None:
        """Stop watching (the owner then stops the child): an exit from now on is not a failure."""
        self._closing.set()
        self._wake.set()

    def _set(self, health: RunnerHealth) -> None:
        self.health = health
        self.history = [*self.history[-(HISTORY - 1) :], health]

    def _stopped(self, restarts: int) -> None:
        self._set(RunnerHealth("stopped", "llama-server was stopped", restarts))

    def _watch(self) -> None:
        process = self.process
        restarts = 0
        while True:
            process.wait_exit(None)
            process.settled()  # a relaunch on purpose (another thread count) replaced the child: watch the new one
            if self._closing.is_set() or process.stop_asked:
                self._stopped(restarts)
                return
            if process.running:
                continue
            summary = process.exit_summary()
            log.warning("%s. Its last lines:\n%s", summary, process.log_tail(LOG_LINES))
            self._stops.append(time.monotonic())
            decision = next_restart(self.policy, self._stops, time.monotonic())
            if decision.delay_s is None:
                self._give_up(summary, decision.why, restarts)
                return
            expected = decision.delay_s + (process.ready_after_s or 1.0)
            self._set(RunnerHealth("restarting", f"{summary}; starting it again", restarts, expected))
            log.warning("starting llama-server again in %.1f s (%s)", decision.delay_s, decision.why)
            self._wake.clear()
            self._wake.wait(decision.delay_s)
            if self._closing.is_set():
                self._stopped(restarts)
                return
            started = time.monotonic()
            try:
                process.respawn(self.ready_timeout_s)
            except OutOfMemoryError as exc:
                log.warning("%s. Its last lines:\n%s", exc.what, process.log_tail(LOG_LINES))
                self._give_up(
                    "llama-server ran out of memory while starting again",
                    next_restart(self.policy, self._stops, time.monotonic(), out_of_memory=True).why,
                    restarts,
                )
                return
            except ServerError as exc:
                if process.stop_asked:  # closed meanwhile, or not ready in time (respawn stopped it)
                    if self._closing.is_set():
                        self._stopped(restarts)
                    else:
                        self._give_up("llama-server did not start again", exc.what.splitlines()[0], restarts)
                    return
                log.warning("llama-server did not start again: %s", exc.what.splitlines()[0])
                continue  # it exited before it was ready: a stop like any other
            restarts += 1
            log.warning("llama-server is running again (%.1f s to start)", time.monotonic() - started)
            self._set(RunnerHealth("ready", f"started again after: {summary}", restarts))

    def _give_up(self, summary: str, why: str, restarts: int) -> None:
        words = f"{summary}; {why}"
        log.error("llama-server given up: %s", words)
        self._set(RunnerHealth("failed", words, restarts))
