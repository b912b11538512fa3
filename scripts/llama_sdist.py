"""The pinned llama-cpp-python sdist and the llama.cpp it vendors, for the scripts that read or build that source
(``build-llama-server``, ``gen_arch_table.py``): one copy of where the pin is, how the sdist is fetched, and how
its llama.cpp commit is found."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "llama-cpp-python"


def pinned_version() -> str:
    """The llama-cpp-python version ``pyproject.toml`` pins (``llama-cpp-python==X``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        m = re.fullmatch(rf"{PACKAGE}\s*==\s*([\w.]+)", requirement.strip())
        if m:
            return m.group(1)
    raise SystemExit(f"pyproject.toml does not pin {PACKAGE} (expected `{PACKAGE}==X` in dependencies)")


def download_sdist(version: str, into: Path, log: Callable[[str], None] = print) -> Path:
    """The llama-cpp-python sdist from the package index (pip's cache makes repeats fast)."""
    log(f"Downloading {PACKAGE}=={version} sdist with pip...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    cmd += [f"{PACKAGE}=={version}", "-d", str(into)]
    subprocess.run(cmd, check=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise SystemExit(f"pip download left no llama_cpp_python-*.tar.gz in {into}")
    return found[0]


def changelog_commit(changelog: str) -> str:
    """The llama.cpp commit a llama-cpp-python release vendors: the newest ``llama.cpp@<sha>`` its
    CHANGELOG names (9 hex digits, as llama.cpp's own build info writes it); ``unknown`` when none is."""
    m = re.search(r"llama\.cpp@([0-9a-f]{7,40})", changelog)
    return m.group(1)[:9] if m else "unknown"
