"""Reading ``llama-diffusion-cli``'s output (for the exactness test and the speed benchmark against it).

The cli prints everything with ``LOG_INF`` (stderr): llama.cpp's load log, a progress bar, ``total time: X ms,
time per step: ..., sampling time per step: ...``, then a blank line, the answer (``common_detokenize(vocab,
answer, false)``) and a newline, then llama.cpp's teardown lines (``~llama_context: ...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")
_TOTAL = re.compile(r"total time: ([0-9.]+)ms[^\n]*\n")
_LOG_LINE = re.compile(r"\n(?:~?llama_\w*|ggml_\w+|common_\w+|~\w+):")


@dataclass(frozen=True)
class CliRun:
    text: str
    seconds: float
    """The generation loop's own ``total time`` (model loading excluded)."""


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
    return CliRun(rest[:-1], float(marker.group(1)) / 1000.0)
