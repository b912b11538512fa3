"""A plan is built in typed stages and assembled once (``plan.types.assemble``): no stage of the decision patches a
plan with ``replace``, and only the assembly gives a plan its ``fits`` (issue 50)."""

from __future__ import annotations

import ast
from pathlib import Path

import clover_local

PACKAGE = Path(clover_local.__file__).parent
DECISION = [PACKAGE / "decide.py", *sorted((PACKAGE / "plan").glob("*.py"))]
PLAN_NAMES = {"plan", "p", "placed", "placement", "alone", "forced"}


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _patches_a_plan(function: ast.FunctionDef, call: ast.Call) -> bool:
    """``replace(x, ...)`` where ``x`` is a parameter typed as a plan, or an untyped name that says it is one."""
    if _name(call) != "replace" or not call.args or not isinstance(call.args[0], ast.Name):
        return False
    name = call.args[0].id
    typed = {a.arg: ast.unparse(a.annotation) for a in function.args.args if a.annotation is not None}
    return typed[name] in ("Plan", "Placed") if name in typed else name in PLAN_NAMES


def test_no_stage_replaces_a_plan() -> None:
    for path in DECISION:
        functions = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)]
        patched = {
            f"{path.name}:{c.lineno}"
            for f in functions
            for c in ast.walk(f)
            if isinstance(c, ast.Call) and _patches_a_plan(f, c)
        }
        assert not patched, patched


def test_only_the_assembly_gives_a_plan_its_fits() -> None:
    """The planner says whether its placement fits, the speculation stage whether it still does with the draft;
    ``assemble`` alone sets a plan's ``fits``, and nothing replaces it."""
    setters = {
        (path.name, _name(c))
        for path in DECISION
        for c in _calls(path)
        if any(k.arg == "fits" for k in c.keywords)
    }
    assert setters == {
        ("planner.py", "Placed"),
        ("planner.py", "Alternative"),
        ("speculation.py", "Speculation"),
        ("types.py", "update"),
    }
