"""Run ``clover-local ARGS`` in this process and SIGKILL it at one step of a runtime install (a test tool).

    python tests/runtime_fault_child.py PHASE ARGS...

The kill is real (no cleanup handlers, no ``finally``), so the runtimes folder is left as a power cut would leave
it. PHASE is one of :data:`PHASES`; a kill mid-download needs no child of this kind (the test holds the transfer
in the stand-in and kills a plain ``clover-local``).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from clover_local.cli import main
from clover_local.runtimes import install

PHASES = (
    "unpacking",  # the archive is downloaded and verified, the partial folder exists, nothing unpacked yet
    "sources",  # unpacked, the tag's llama-arch.cpp and arg.cpp not fetched yet
    "rename",  # the manifest is written in the partial folder, which is not renamed into place yet
)
_TARGETS = {"unpacking": "extract_archive", "sources": "_fetch_raw_sources", "rename": "_move_into_place"}


def arm(phase: str) -> None:
    name = _TARGETS.get(phase)
    if name is None:
        raise SystemExit(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
    original: Callable[..., Any] = getattr(install, name)

    def die(*args: Any, **kwargs: Any) -> Any:
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(install, name, die)


if __name__ == "__main__":
    arm(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
