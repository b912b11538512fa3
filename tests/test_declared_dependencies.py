"""Every package the code imports is declared in ``pyproject.toml``, so a fresh install (``pip install
clover-local``, ``pipx``, ``uv tool install``) has it: product code's imports in ``[project] dependencies``, the
test models' and the tests' in the ``test`` extra as well. An import inside ``try``/``except ImportError`` is
optional and may be missing. Import names are mapped to the distributions that provide them in this
environment (``importlib.metadata.packages_distributions``); and each runtime dependency has an upper bound."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(requirements: list[str]) -> set[str]:
    found = set()
    for requirement in requirements:
        match = _NAME.match(requirement)
        assert match, requirement
        found.add(_canonical(match.group(1)))
    return found


RUNTIME = _declared(PYPROJECT["project"]["dependencies"])
TEST = RUNTIME | _declared(PYPROJECT["project"]["optional-dependencies"]["test"])


def _optional_lines(tree: ast.AST) -> set[int]:
    """Lines of imports inside a ``try`` whose handlers catch ImportError (or any Exception)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = {ast.unparse(h.type) if h.type is not None else "" for h in node.handlers}
        if caught & {"ImportError", "ModuleNotFoundError", "Exception", ""} or any(
            "ImportError" in c for c in caught
        ):
            for inner in node.body:
                lines |= {n.lineno for n in ast.walk(inner) if isinstance(n, ast.Import | ast.ImportFrom)}
    return lines


def imports_of(folder: Path, root: Path = ROOT, *, optional_too: bool = False) -> dict[str, set[str]]:
    """Top-level names of the absolute imports under ``folder`` that are neither optional, nor the standard
    library, nor the project's own or a module of the folder itself -> the files importing them (relative to
    ``root``)."""
    local = {folder.name} | {p.stem for p in folder.glob("*.py")}  # tests/ imports its helpers by name
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        optional = set() if optional_too else _optional_lines(tree)
        for node in ast.walk(tree):
            if node.lineno in optional if isinstance(node, ast.Import | ast.ImportFrom) else True:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("clover_local", "__future__") or top in local:
                    continue
                found.setdefault(top, set()).add(str(path.relative_to(root)))
    return found


def _undeclared(imports: dict[str, set[str]], declared: set[str]) -> list[str]:
    providers = importlib.metadata.packages_distributions()
    missing = []
    for top, files in sorted(imports.items()):
        dists = {_canonical(d) for d in providers.get(top, [])}
        if not dists:
            missing.append(f"{top} (not installed here; imported by {', '.join(sorted(files))})")
        elif not dists & declared:
            missing.append(f"{top} from {', '.join(sorted(dists))} (imported by {', '.join(sorted(files))})")
    return missing


def test_product_code_imports_only_declared_dependencies() -> None:
    product = {
        top: files
        for top, files in imports_of(ROOT / "clover_local").items()
        if any(not f.startswith("clover_local/testing/") for f in files)
    }
    assert "uvicorn" in product and "textual" in product  # the scan sees imports at all
    assert _undeclared(product, RUNTIME) == []


@pytest.mark.parametrize("folder", ["clover_local/testing", "tests"])
def test_the_tests_import_only_declared_dependencies(folder: str) -> None:
    assert _undeclared(imports_of(ROOT / folder), TEST) == []


def test_a_package_imported_and_not_declared_is_found(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "import yaml\ntry:\n    import amdsmi\nexcept ImportError:\n    amdsmi = None\nimport json\n"
    )
    found = imports_of(tmp_path, tmp_path)
    assert set(found) == {"yaml"}  # amdsmi is optional, json is the standard library
    assert _undeclared(found, {"numpy"}) and not _undeclared(found, {"pyyaml"})


def test_every_runtime_dependency_is_bounded_and_nothing_unused_is_declared() -> None:
    for requirement in PYPROJECT["project"]["dependencies"]:
        assert "<" in requirement or "==" in requirement, f"{requirement} has no upper bound"
    imported = {
        _canonical(d)
        for top in imports_of(ROOT / "clover_local", optional_too=True)
        for d in importlib.metadata.packages_distributions().get(top, [])
    }
    assert RUNTIME - imported == set(), "declared but never imported"
