#!/usr/bin/env python3
"""Time to first chat, as a new person meets clover-local: each step timed on its own, in a fresh set of user
folders, with no network but the local stand-ins.

1. install: build the wheel and install it, not the checkout, into a clean venv at the locked versions
   (``requirements.lock``, with the demo model), as ``pipx install`` does; llama-cpp-python's wheel comes from
   pip's cache when one was built before (say so in the figures: a first install compiles llama.cpp);
2. the first ``clover-local plan`` (the default preset, ``--offline``: the preset's sizes);
3. ``clover-local runtime install`` of a llama.cpp release, from the releases stand-in (``tests/releases_server.py``)
   serving the pinned llama-server packed as upstream packs a release (or a stand-in script when none is built);
4. the demo chat's first reply: ``clover-local run smollm2-135m`` (load, then 32 tokens).

    python3 benchmarks/time_first_chat.py                 # all four (the install takes minutes)
    python3 benchmarks/time_first_chat.py --skip-install  # steps 2-4 with this interpreter's clover-local

Prints one line per step and a JSON summary; figures belong in docs/measurements.md with the command, the date
and the machine (an otherwise idle one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

TAG = "b9100"


def _timed(label: str, argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{label} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    print(f"{label:<28} {took:8.1f} s", flush=True)
    return took


def _install(work: Path, env: dict[str, str]) -> tuple[Path, float]:
    """The installed ``clover-local`` and the seconds the wheel build and install took."""
    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(ROOT)],
        check=True,
    )
    wheel = next((work / "dist").glob("clover_local-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
    pip = [
        str(work / "venv" / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "-c",
        str(ROOT / "requirements.lock"),
    ]
    subprocess.run([*pip, f"{wheel}[demo]"], check=True, env=env)
    took = time.monotonic() - start
    print(f"{'install (wheel, locked)':<28} {took:8.1f} s", flush=True)
    return work / "venv" / "bin" / "clover-local", took


def _release_archive(work: Path) -> Path:
    """The pinned llama-server packed as upstream packs a Linux x64 release, else a script that answers
    ``--version`` (then the step times the installer, not the binary's size)."""
    import tarfile

    from clover_local import settings

    built = settings.llama_server_dir() / "llama-server"
    archive = work / f"llama-{TAG}-bin-ubuntu-x64.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        if built.is_file():
            tf.add(built, arcname=f"llama-{TAG}/llama-server")
            for lib in sorted(built.parent.glob("*.so*")):
                tf.add(lib, arcname=f"llama-{TAG}/{lib.name}")
        else:
            script = work / "llama-server"
            script.write_text("#!/bin/sh\necho 'version: 9100 (0000000)'\n")
            script.chmod(0o755)
            tf.add(script, arcname=f"llama-{TAG}/llama-server")
    return archive


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-install", action="store_true", help="use this interpreter's clover-local")
    args = parser.parse_args()

    from helpers_runtimes import ARCH_CPP, ARG_CPP
    from releases_server import ReleasesServer

    with tempfile.TemporaryDirectory(prefix="clover-first-chat-") as tmp:
        work = Path(tmp)
        home = work / "home"
        env = {
            **os.environ,
            "CLOVER_CONFIG_DIR": str(home / "config"),
            "CLOVER_DATA_DIR": str(home / "data"),
            "CLOVER_CACHE_DIR": str(home / "cache"),
            "HF_HOME": str(home / "hf"),
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": "",
        }
        times: dict[str, float] = {}
        if args.skip_install:
            command = [sys.executable, "-m", "clover_local"]
            env["PYTHONPATH"] = str(ROOT)
        else:
            binary, times["install"] = _install(work, env)
            command = [str(binary)]
        times["first plan"] = _timed("first plan (--offline)", [*command, "plan", "--offline"], env, work)
        releases = ReleasesServer().start()
        try:
            releases.add_release(TAG, latest=True)
            archive = _release_archive(work)
            releases.add_asset(TAG, archive.name, archive)
            releases.add_raw(TAG, "src/llama-arch.cpp", ARCH_CPP)
            releases.add_raw(TAG, "common/arg.cpp", ARG_CPP)
            stand_in = {
                **env,
                "CLOVER_LLAMACPP_RELEASES": releases.api_url,
                "CLOVER_LLAMACPP_RAW": releases.raw_url,
            }
            stand_in.pop("HF_HUB_OFFLINE")  # offline asks no server at all; the stand-in is the only one here
            times["runtime install"] = _timed(
                "runtime install (stand-in)",
                [*command, "runtime", "install", TAG, "--backend", "cpu"],
                stand_in,
                work,
            )
        finally:
            releases.stop()
        prompt = ["--prompt", "Name three planets.", "--max-tokens", "32", "--temperature", "0"]
        times["demo reply"] = _timed(
            "demo chat reply (32 tokens)", [*command, "run", "smollm2-135m", *prompt], env, work
        )
        print(
            json.dumps(
                {
                    "seconds": {k: round(v, 1) for k, v in times.items()},
                    "total": round(sum(times.values()), 1),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
