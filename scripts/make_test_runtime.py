#!/usr/bin/env python3
"""Build the test runtime: llama-server from the pinned llama.cpp source with one change, its ``src/llama-arch.cpp``
naming the qwen35moe architecture ``clover_moe`` (``clover_local.testing.runtime``), installed as release
``b99999`` in the layout of an installed upstream runtime, into ``$CLOVER_TEST_RUNTIMES`` (else
``<data dir>/llama.cpp/test-runtimes``). The end-to-end tests of a model only an installed runtime knows run it.

It reuses the source and build tree ``scripts/build-llama-server`` keeps in the cache dir (and makes one the first
time), changes the one file, builds the llama-server target (ninja recompiles that file and relinks), and puts the
file back, whatever happens. Idempotent: exits at once when the runtime is there.

    scripts/make_test_runtime.py [--jobs N] [--force]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from llama_sdist import build_targets, kept_tree, pinned_version  # noqa: E402

from clover_local import settings  # noqa: E402
from clover_local.arch_support import parse_llama_arch  # noqa: E402
from clover_local.runtimes.installed import ARCH_SOURCE, write_manifest  # noqa: E402
from clover_local.testing.runtime import (  # noqa: E402
    STAMP,
    TEST_ARCH,
    TEST_TAG,
    built_runtime,
    patch_arch_source,
    runtimes_folder,
)

BACKEND = "cpu"


def log(message: str) -> None:
    print(f"[make_test_runtime] {message}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--force", action="store_true", help="build again even when it is there")
    args = parser.parse_args()
    folder = runtimes_folder()
    done = built_runtime(folder)
    if done is not None and not args.force:
        log(f"The test runtime {TEST_TAG} ({TEST_ARCH}) is already in {done.root}.")
        return 0
    started = time.monotonic()
    from filelock import FileLock

    tree = kept_tree(settings.cache_dir(), pinned_version(), BACKEND, log)
    with FileLock(str(tree.root / "tree.lock")):
        arch_file = tree.src / "src" / "llama-arch.cpp"
        original = arch_file.read_text(encoding="utf-8")
        patched = patch_arch_source(original)
        arch_file.write_text(patched, encoding="utf-8")
        try:
            bin_dir = build_targets(tree, BACKEND, ["llama-server"], args.jobs, log)
            partial = folder / f".partial-{TEST_TAG}-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            (partial / "bin").mkdir(parents=True)
            shutil.copy2(bin_dir / "llama-server", partial / "bin" / "llama-server")
        finally:
            # Written anew (not copied back with its old mtime), so the next build of the tree recompiles it.
            arch_file.write_text(original, encoding="utf-8")
        (partial / ARCH_SOURCE).write_text(patched, encoding="utf-8")
        shutil.copy2(tree.src / "common" / "arg.cpp", partial / "arg.cpp")
    table = parse_llama_arch(patched)
    assert TEST_ARCH in table.names and "qwen35moe" not in table.names
    seconds = round(time.monotonic() - started)
    write_manifest(
        partial,
        {
            "tag": TEST_TAG,
            "backend": BACKEND,
            "origin": "source",
            "server": "bin/llama-server",
            "asset": None,
            "sha256": None,
            "installed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "test_runtime": STAMP,
            "llama_cpp_commit": tree.commit,
            "build_seconds": seconds,
        },
    )
    target = folder / TEST_TAG
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    log(f"Built the test runtime {TEST_TAG} (knows {TEST_ARCH}, not qwen35moe) into {target} in {seconds} s.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        log(f"A build step failed (exit {exc.returncode}): {' '.join(map(str, exc.cmd))}")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
