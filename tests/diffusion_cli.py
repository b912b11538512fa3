"""Reading ``llama-diffusion-cli``'s output (for the exactness test and the speed benchmark against it).

The cli prints everything with ``LOG_INF`` (stderr): llama.cpp's load log, a progress bar, ``total time: X ms,
time per step: ..., sampling time per step: ...``, then a blank line, the answer (``common_detokenize(vocab,
answer, false)``) and a newline, then llama.cpp's teardown lines (``~llama_context: ...``).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clover_local.engine.repack import common_argv_here

_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")
_TOTAL = re.compile(r"total time: ([0-9.]+)ms[^\n]*\n")
_SAMPLING = re.compile(r"sampling time per step: ([0-9.]+)ms")
_LOG_LINE = re.compile(r"\n(?:~?llama_\w*|ggml_\w+|common_\w+|~\w+):")


@dataclass(frozen=True)
class CliRun:
    text: str
    seconds: float
    """The generation loop's own ``total time`` (model loading excluded)."""
    sampling_s_per_step: float | None = None
    """Its ``sampling time per step``: everything a step does besides decoding the canvas."""


def parse_cli_output(output: str) -> CliRun:
    """The answer text and the loop's time; ``ValueError`` when the output is not a finished generation."""
    marker = _TOTAL.search(output)
    if marker is None:
        raise ValueError("no 'total time' line: the cli did not finish a generation")
    rest = _PREFIX.sub("", output[marker.end() :], count=1)  # llama.cpp's log prefix, when it writes one
    if not rest.startswith("\n"):
        raise ValueError("no blank line after 'total time'")
    rest = rest[1:]
    tail = _LOG_LINE.search(rest)
    if tail:
        rest = rest[: tail.start() + 1]
    if not rest.endswith("\n"):
        raise ValueError("the answer is not followed by a newline")
    sampling = _SAMPLING.search(marker.group(0))
    per_step = float(sampling.group(1)) / 1000.0 if sampling else None
    return CliRun(rest[:-1], float(marker.group(1)) / 1000.0, per_step)


class CliOutputLost(RuntimeError):
    """The cli finished but its answer never reached its log (see :func:`run_cli`)."""


def run_cli(cmd: list[str], *, attempts: int = 5, timeout_s: float = 300) -> CliRun:
    """Run ``llama-diffusion-cli`` (``cmd`` without ``--log-file``) and read its answer and timing.

    llama.cpp's logger writes from a worker thread, and its last lines (the answer) can be lost at exit on a
    busy machine; so the cli also writes its log to a file, and a run whose answer did not arrive is repeated
    (the same seed gives the same answer). A failing cli raises ``subprocess.CalledProcessError``."""
    for _ in range(attempts):
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "cli.log"
            done = subprocess.run(
                [*common_argv_here(cmd), "--log-file", str(log)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            if done.returncode != 0:
                raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
            text = log.read_text(errors="replace") if log.exists() else ""
        for output in (text, done.stdout + done.stderr):
            try:
                return parse_cli_output(output)
            except ValueError:
                continue
    raise CliOutputLost(f"llama-diffusion-cli lost the end of its answer in {attempts} runs")
