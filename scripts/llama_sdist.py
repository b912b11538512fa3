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


# -- the kept source and build tree ------------------------------------------------------------------------------

_UNPACKED = "unpacked.json"


class SourceTree:
    """The pinned llama.cpp source unpacked once into ``<cache>/llama-server-tree/<version>-<backend>/src`` and
    its CMake build folder beside it (``build``). Kept between builds, so a rebuild, or the test runtime's one
    changed file, compiles only what changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.src = root / "src"
        self.build = root / "build"

    @property
    def commit(self) -> str:
        import json

        try:
            return str(json.loads((self.root / _UNPACKED).read_text(encoding="utf-8"))["commit"])
        except (OSError, ValueError, KeyError):
            return "unknown"

    @property
    def unpacked(self) -> bool:
        return (self.root / _UNPACKED).is_file() and (self.src / "CMakeLists.txt").is_file()


def kept_tree(cache_dir: Path, version: str, backend: str, log: Callable[[str], None] = print) -> SourceTree:
    """The kept tree for ``version`` and ``backend``, unpacked from the sdist the first time."""
    import json
    import shutil
    import tempfile

    tree = SourceTree(cache_dir / "llama-server-tree" / f"{version}-{backend}")
    if tree.unpacked:
        return tree
    shutil.rmtree(tree.root, ignore_errors=True)  # half unpacked, or the old layout (a bare build folder)
    tree.root.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="clover-llama-src-", dir=tree.root) as tmp:
        sdist = download_sdist(version, Path(tmp) / "dl", log)
        src, commit = unpack_llama_cpp(sdist, Path(tmp) / "x")
        src.rename(tree.src)
    (tree.root / _UNPACKED).write_text(json.dumps({"version": version, "commit": commit}) + "\n")
    return tree


def unpack_llama_cpp(sdist: Path, into: Path) -> tuple[Path, str]:
    """Extract ``vendor/llama.cpp`` and the changelog; return the source dir and the llama.cpp commit."""
    import tarfile

    with tarfile.open(sdist) as tar:
        members = [
            m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name or m.name.endswith("/CHANGELOG.md")
        ]
        tar.extractall(into, members=members, filter="data")
    top = next(into.iterdir())
    changelog = top / "CHANGELOG.md"
    commit = changelog_commit(changelog.read_text(encoding="utf-8")) if changelog.exists() else "unknown"
    return top / "vendor" / "llama.cpp", commit


def build_targets(
    tree: SourceTree, backend: str, targets: list[str], jobs: int, log: Callable[[str], None] = print
) -> Path:
    """Configure (cheap when already configured) and build ``targets`` in the kept tree, with the one set of
    CMake options every build uses (``clover_local.runtimes.build``): the bin folder."""
    from clover_local.runtimes.build import cmake_build

    return cmake_build(tree.src, tree.build, backend, tree.commit, jobs, targets, log)
