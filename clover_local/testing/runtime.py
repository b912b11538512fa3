"""A test runtime: llama-server built from the pinned llama.cpp with one change, so that it knows an architecture
the pinned (embedded) llama.cpp does not, as an upstream release newer than the pin does.

The change renames the ``qwen35moe`` row of ``LLM_ARCH_NAMES`` (``src/llama-arch.cpp``) to ``clover_moe``: the
runtime then loads qwen35moe-shaped GGUFs whose header says ``clover_moe`` (every ``<arch>.*`` key is read under
that prefix) and no longer loads ``qwen35moe``. ``scripts/make_test_runtime.py`` builds it into
:func:`runtimes_folder` in the layout of :mod:`clover_local.runtimes.installed`, tagged :data:`TEST_TAG`.
"""

from __future__ import annotations

import os
from pathlib import Path

from clover_local.runtimes.installed import InstalledRuntime, read_runtime

TEST_TAG = "b99999"
"""Newer than any release the tests' stand-ins name, so it is always the newest installed."""
TEST_ARCH = "clover_moe"
_ROW = '{ LLM_ARCH_QWEN35MOE,        "qwen35moe"        },'
_PATCHED_ROW = '{ LLM_ARCH_QWEN35MOE,        "clover_moe"       },'
STAMP = "clover_moe-row-1"
"""In the manifest (``test_runtime``): a runtime built by an older recipe is built again."""


def runtimes_folder() -> Path:
    """Where the test runtime is installed: ``$CLOVER_TEST_RUNTIMES``, else ``<data dir>/llama.cpp/test-runtimes``
    (beside the built llama-server). Tests point ``CLOVER_RUNTIMES_DIR`` here."""
    override = os.environ.get("CLOVER_TEST_RUNTIMES")
    if override:
        return Path(override).expanduser()
    from clover_local import settings

    return settings.data_dir() / "llama.cpp" / "test-runtimes"


def patch_arch_source(text: str) -> str:
    """``src/llama-arch.cpp`` with the qwen35moe name row renamed to clover_moe (ValueError when the row is not
    there exactly once: another llama.cpp, which this recipe does not know)."""
    if text.count(_ROW) != 1:
        raise ValueError(f"llama-arch.cpp has not exactly one {_ROW!r} row")
    return text.replace(_ROW, _PATCHED_ROW)


def built_runtime(folder: Path | None = None) -> InstalledRuntime | None:
    """The built test runtime, None when it is not (completely) built by the current recipe."""
    import json

    root = (folder or runtimes_folder()) / TEST_TAG
    runtime = read_runtime(root)
    if runtime is None:
        return None
    try:
        manifest = json.loads((root / "runtime.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return runtime if isinstance(manifest, dict) and manifest.get("test_runtime") == STAMP else None
