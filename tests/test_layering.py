"""The package's layering, read from the source with ``ast`` (every import counts: module level, inside
functions, and under ``TYPE_CHECKING``):

    base (errors, settings, presets, user_prefs)  <-  detect, gguf  <-  plan  <-  fetch  <-  engine, llamacpp
        <-  runtime, conversations, measure  <-  serve  <-  tui  <-  commands  <-  cli

A module imports only from its own layer or below; no import cycle, between modules or between packages;
nothing but ``clover_local.tui`` imports Textual; the pure packages (detect, gguf, plan) do no network I/O; and
no product module imports the test-model writers (``clover_local.testing``, left out of the wheel).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "clover_local"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("clover_local", "clover_local.errors", "clover_local.settings"),
    ("clover_local.presets",),
    ("clover_local.user_prefs",),
    ("clover_local.detect", "clover_local.gguf"),
    ("clover_local.plan",),
    ("clover_local.fetch",),
    ("clover_local.engine", "clover_local.llamacpp"),
    ("clover_local.runtime", "clover_local.conversations", "clover_local.measure"),
    ("clover_local.serve",),
    ("clover_local.tui",),
    ("clover_local.commands",),
    ("clover_local.cli", "clover_local.__main__"),
)
"""Lowest first. A module's layer is that of the longest name here that it is, or is inside."""
TEST_ONLY = "clover_local.testing"
PURE = ("clover_local.detect", "clover_local.gguf", "clover_local.plan")
NETWORK = (
    "huggingface_hub",
    "httpx",
    "httpx2",
    "hf_xet",
    "urllib.request",
    "http.client",
    "uvicorn",
    "starlette",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, resolved to a module of this package where it is one (``from
    clover_local import settings`` is ``clover_local.settings``), else the imported name as written."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                found.add(candidate if candidate in MODULES else module)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    best, best_len = -1, -1
    for index, names in enumerate(LAYERS):
        for owner in names:
            if (module == owner or module.startswith(owner + ".")) and len(owner) > best_len:
                best, best_len = index, len(owner)
    return best


def _ours(module: str) -> bool:
    return module == "clover_local" or module.startswith("clover_local.")


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if _layer(m) < 0 and not m.startswith(TEST_ONLY)]
    assert not unplaced, f"add these to LAYERS in {Path(__file__).name}: {unplaced}"


def test_no_upward_import() -> None:
    upward = [
        f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
        for m, deps in GRAPH.items()
        if not m.startswith(TEST_ONLY)
        for d in sorted(deps)
        if _ours(d) and not d.startswith(TEST_ONLY) and _layer(d) > _layer(m)
    ]
    assert not upward, "\n".join(upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_no_import_cycle_between_modules() -> None:
    graph = {m: {d for d in deps if d in MODULES and d != m} for m, deps in GRAPH.items()}
    # A package's __init__ is imported on the way to any of its modules: that is not a dependency on its siblings.
    cycle = _cycle({m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()})
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_cycle_between_packages() -> None:
    def package(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:2])

    graph: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        graph.setdefault(package(m), set()).update(
            package(d) for d in deps if _ours(d) and d != "clover_local" and package(d) != package(m)
        )
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_only_the_tui_imports_textual() -> None:
    offenders = [
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if not m.startswith("clover_local.tui")
        for d in deps
        if d == "textual" or d.startswith("textual.")
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("pure", PURE)
def test_pure_packages_do_no_network_io(pure: str) -> None:
    offenders = [
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if m == pure or m.startswith(pure + ".")
        for d in deps
        if d.startswith(NETWORK) or (_ours(d) and _layer(d) >= _layer("clover_local.fetch"))
    ]
    assert not offenders, "\n".join(offenders)


def test_the_product_never_imports_the_test_model_writers() -> None:
    offenders = [
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if not m.startswith(TEST_ONLY)
        for d in deps
        if d.startswith(TEST_ONLY)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_checker_sees_an_upward_import_and_a_cycle() -> None:
    """The rules above are not vacuous: a planner importing the fetch step, and two modules importing each
    other, are caught."""
    assert _layer("clover_local.plan.planner") < _layer("clover_local.fetch.describe")
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "clover_local.settings" in _imports("clover_local.fetch.x", PACKAGE / "fetch" / "cache.py")
