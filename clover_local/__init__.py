"""clover-local: run Clover-35B-A3B-Preview well on your own machine.

The package flows one way: ``detect`` (hardware) -> ``plan`` (what fits, which flags) -> ``fetch``
(Hugging Face) -> ``engine`` / ``serve`` (llama.cpp) -> ``tui`` (chat). Nothing outside ``tui`` imports
Textual, and ``llama_cpp`` is imported lazily where it is used.
"""

__version__ = "0.1.0"

from clover_local._native import preload_llama_library as _preload_llama_library

_preload_llama_library()  # before anything imports numpy: see clover_local._native
