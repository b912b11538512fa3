"""What llama.cpp's load log says about a failed load, read the same way for the embedded engine's log and a
``llama-server`` child's: running out of memory is met with a re-plan for less memory, anything else is an error."""

from __future__ import annotations

import re

OUT_OF_MEMORY_RE = re.compile(
    r"out of memory|failed to allocate|unable to allocate|cudaMalloc failed|ErrorOutOfDeviceMemory|"
    r"failed to create .*buffer|buffer allocation failed|bad_alloc",
    re.IGNORECASE,
)


def says_out_of_memory(log_text: str) -> bool:
    """Whether llama.cpp's log says a buffer could not be allocated (GPU or host)."""
    return OUT_OF_MEMORY_RE.search(log_text) is not None
