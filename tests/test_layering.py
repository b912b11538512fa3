"""The package's layering, read from the source with ``ast`` (every import counts: module level, inside
functions, and under ``TYPE_CHECKING``):

    base (errors, settings, presets, user_prefs)  <-  detect, gguf  <-  plan  <-  fetch  <-  engine, llamacpp
        <-  model_files, facts, decide, conversations, chat_store  <-  launch  <-  measure  <-  compare  <-  serve  <-  tui  <-  commands  <-  cli

A module imports only from its own layer or below; no import cycle, between modules or between packages;
nothing but ``clover_local.tui`` imports Textual; the pure packages (detect, gguf, plan) do no network I/O; and
no product module imports the test-model writers (``clover_local.testing``, left out of the wheel); nothing in
the package imports ``benchmarks/`` (the harness sits beside the product); and the decisions that once drifted (the experts regex, the shard regex, llama-server's ``-m``) are written in one
module each.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "clover_local"

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "clover_local",
        "clover_local.errors",
        "clover_local.settings",
        "clover_local.runtimes.installed",
        # The releases client: the architecture check (base) asks the latest release before any model byte.
        "clover_local.runtimes.net",
        "clover_local.runtimes.releases",
        "clover_local.runtimes.upstream",
    ),
    # The architecture check reads the presets' word on the first release that loads an architecture.
    ("clover_local.presets", "clover_local.arch_support"),
    ("clover_local.detect", "clover_local.gguf"),
    ("clover_local.plan",),
    ("clover_local.user_prefs",),  # the app's remembered choices are plan choices (the --spec mode)
    ("clover_local.fetch",),
    (
        "clover_local.engine",
        "clover_local.llamacpp",
        "clover_local.rpc",
        "clover_local.measure.records",
        "clover_local.runtimes",
    ),
    (
        "clover_local.model_files",
        "clover_local.launch_types",
        "clover_local.facts",
        "clover_local.decide",
        "clover_local.conversations",
        "clover_local.chat_store",
    ),
    ("clover_local.launcher",),  # the one owner of a launch's facts and decisions
    ("clover_local.launch",),
    ("clover_local.measure",),
    ("clover_local.compare",),
    ("clover_local.serve",),
    ("clover_local.tui",),
    ("clover_local.commands",),
    ("clover_local.cli", "clover_local.__main__"),
)
"""Lowest first. A module's layer is that of the longest name here that it is, or is inside; that name is also
its unit for the cycle check between packages (``measure.records``, which ``facts`` reads, sits below the rest of
``measure``, which runs plans through the launch)."""
TEST_ONLY = "clover_local.testing"
LLAMA_BENCH_ARGV = ("clover_local.measure.llama_bench", "clover_local.commands.bench")
OTHER_ENGINES_ARGV = ("clover_local.plan.server_engines",)
"""vLLM and SGLang commands (``python3 -m sglang.launch_server``): other tools, with their own flags."""
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
        return max(
            (o for names in LAYERS for o in names if m == o or m.startswith(o + ".")), key=len, default=m
        )

    graph: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        graph.setdefault(package(m), set()).update(
            package(d) for d in deps if _ours(d) and package(d) not in ("clover_local", package(m))
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
    """No exception today: ``clover_local.testing`` is left out of the wheel, so a product import of it would
    fail on every install."""
    offenders = [
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if not m.startswith(TEST_ONLY)
        for d in deps
        if d.startswith(TEST_ONLY)
    ]
    assert not offenders, "\n".join(offenders)


BENCHMARKS = PACKAGE.parent / "benchmarks"


def _benchmark_modules() -> set[str]:
    """The names a ``benchmarks/`` module is imported by (its scripts put the folder on ``sys.path``), and the
    folder's own name."""
    return {BENCHMARKS.name} | {p.stem for p in BENCHMARKS.glob("*.py")}


def test_nothing_in_the_package_imports_the_benchmarks() -> None:
    """The harness sits beside the product: benchmarks import ``clover_local`` (and ``clover_local.testing``),
    never the other way round, and ``clover_local.testing`` holds only what tests and benchmarks share."""
    names = _benchmark_modules()
    assert {"_serve_bench", "bench_serve"} <= names  # the rule sees the folder
    offenders = [f"{m} imports {d}" for m, deps in GRAPH.items() for d in deps if d.split(".")[0] in names]
    assert not offenders, "\n".join(offenders)


SETTINGS_PRODUCER = "clover_local.plan.llama_args"
SETTINGS_CONSUMERS = ("clover_local.engine.native", "clover_local.engine.loader")
"""The embedded engine reads the settings it is given (``native.build_params``); nothing else builds them."""
SETTING_KEYS = {
    "n_ctx",
    "n_threads",
    "n_gpu_layers",
    "n_batch",
    "n_ubatch",
    "tensor_buft_overrides",
    "n_rs_seq",
    "n_outputs_max_per_seq",
}


def _settings_built(source: str) -> list[str]:
    """Where ``source`` builds llama.cpp settings by hand: a dict literal with their keys (``{"n_ctx": ...}``), or
    one set or changed by key (``settings["n_ubatch"] = ...``, ``settings["n_batch"] += ...``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if keys & SETTING_KEYS:
                found.append(f"{node.lineno} builds {sorted(keys & SETTING_KEYS)}")
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for target in targets:
            for sub in ast.walk(target):
                key = sub.slice if isinstance(sub, ast.Subscript) else None
                if isinstance(key, ast.Constant) and key.value in SETTING_KEYS:
                    found.append(f"{node.lineno} sets {key.value!r}")
    return found


def test_nothing_but_the_settings_producer_builds_llama_cpp_settings() -> None:
    """A dict with llama.cpp's keyword names (``{"n_ctx": ...}``), or one changed by key after the plan
    (``settings["n_ubatch"] = ...``), is built only in ``plan.llama_args``: every launch renders its settings
    there, so the command shown is what loads (tests and scripts load files through ``testing.settings``)."""
    offenders = []
    for name, path in MODULES.items():
        if name in (SETTINGS_PRODUCER, *SETTINGS_CONSUMERS) or name.startswith(TEST_ONLY):
            continue
        offenders += [f"{name}:{where}" for where in _settings_built(path.read_text(encoding="utf-8"))]
    assert not offenders, "\n".join(offenders)


def test_the_settings_guard_sees_a_hand_built_dict_and_a_changed_key() -> None:
    """The guard above is not vacuous: a settings dict, a key set after the plan and one bumped are each
    caught; reading a key, or the same names in a call's keywords, are not."""
    snippet = (
        "settings = {'n_ctx': 4096, 'n_threads': 2}\n"
        "settings['n_ubatch'] = max(settings['n_ubatch'], 18)\n"
        "params['n_batch'] += 1\n"
        "ctx = settings['n_ctx']\n"
        "plan_diffusion(header, n_ctx=ctx)\n"
    )
    assert sorted(_settings_built(snippet)) == [
        "1 builds ['n_ctx', 'n_threads']",
        "2 sets 'n_ubatch'",
        "3 sets 'n_batch'",
    ]


PLANNERS = {
    "_plan": ("clover_local.decide",),
    "make_plan": ("clover_local.decide", "clover_local.plan.planner"),
}
"""Who may call the planner directly: ``decide.decide`` plans once it has chosen the runner (through its
``_plan``, which calls ``make_plan``; the planner calls itself for pooled devices). Everything else (commands,
the app's screens, ``download``'s quant, ``serve``, ``doctor``, ``bench``, ``measure``, scripts) asks
``launch.decide_launch`` (or ``decide.decide`` with gathered facts), so no plan is budgeted for an engine other
than the one that runs it."""


def _planner_calls(path: Path) -> list[tuple[str, int]]:
    """Calls of the planner functions in a file (``f(...)``, ``module.f(...)``), and imports of them by name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name in PLANNERS:
                found.append((name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            found.extend((alias.name, node.lineno) for alias in node.names if alias.name in PLANNERS)
    return found


def test_only_the_launch_plans() -> None:
    """Every plan comes from the launch, made after its runner is chosen: a plan made directly is budgeted for
    the embedded engine whatever runs it (the app's plan screen and ``download``'s quant once were, while
    Clover runs in llama-server). Scripts and benchmarks count too; tests may drive the pure planner
    (``make_plan``) with tables of machines, but not the launch's private step."""
    root = PACKAGE.parent
    offenders = []
    for name, path in MODULES.items():
        if name.startswith(TEST_ONLY):
            continue
        offenders += [
            f"{name}:{line} calls {f}" for f, line in _planner_calls(path) if name not in PLANNERS[f]
        ]
    for folder in ("scripts", "benchmarks"):
        for path in sorted((root / folder).glob("*.py")):
            offenders += [
                f"{folder}/{path.name}:{line} calls {f}"
                for f, line in _planner_calls(path)
                if f != "make_plan"
            ]
    for path in sorted((root / "tests").glob("*.py")):
        offenders += [
            f"tests/{path.name}:{line} calls {f}" for f, line in _planner_calls(path) if f == "_plan"
        ]
    assert not offenders, "\n".join(offenders)
    # Not vacuous: the decision's own call is seen, and so would a screen's.
    assert any(f == "_plan" for f, _ in _planner_calls(MODULES["clover_local.decide"]))


def test_the_checker_sees_an_upward_import_and_a_cycle() -> None:
    """The rules above are not vacuous: a planner importing the fetch step, and two modules importing each
    other, are caught."""
    assert _layer("clover_local.plan.planner") < _layer("clover_local.fetch.describe")
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "clover_local.settings" in _imports("clover_local.fetch.x", PACKAGE / "fetch" / "cache.py")


def _runs_python(node: ast.AST) -> bool:
    """``[sys.executable, "-m", "pkg.module", ...]``: Python's ``-m``, not llama.cpp's."""
    return (
        isinstance(node, ast.List)
        and bool(node.elts)
        and isinstance(node.elts[0], ast.Attribute)
        and node.elts[0].attr == "executable"
    )


def _string_constants(path: Path) -> list[str]:
    """String literals that build something: not docstrings (of modules, classes, functions or attributes), and
    not members of a set or a comparison (``flag in {"-m", "-c"}`` reads flags, it does not write them), not a Python
    command line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skipped.add(id(node.value))
        elif isinstance(node, ast.Set | ast.Compare) or _runs_python(node):
            skipped.update(id(child) for child in ast.walk(node))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
    ]


@pytest.mark.parametrize(
    ("what", "needle", "owner"),
    [
        ("the routed-experts tensor regex", "ffn_(up|down|gate", "clover_local.gguf.names"),
        ("the split-GGUF name regex", "-of-(?P<", "clover_local.gguf.names"),
        ("llama-server's model flag", "-m", "clover_local.plan.llama_args"),
    ],
)
def test_each_decision_is_written_once(what: str, needle: str, owner: str) -> None:
    """The experts regex once drifted across four copies, and argv builders lost ``-m``: one owner each.
    (``llama-bench``, vLLM and SGLang are other tools with their own flags: their argv builders are not
    llama-server's.)"""
    holders = sorted(
        m
        for m, path in MODULES.items()
        if not m.startswith(TEST_ONLY)
        and m not in LLAMA_BENCH_ARGV
        and m not in OTHER_ENGINES_ARGV
        and any(s == needle or (len(needle) > 2 and needle in s) for s in _string_constants(path))
    )
    assert holders == [owner], f"{what} is written in {holders}; only {owner} should hold it"


ENGINE_PACKAGES = ("clover_local.engine", "clover_local.llamacpp")


def _engine_classes() -> set[str]:
    """The engine classes and protocols the engine packages define (``EmbeddedEngine``, ``LlamaServerEngine``...)."""
    return {
        node.name
        for m, path in MODULES.items()
        if m.startswith(ENGINE_PACKAGES)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Engine")
    }


def _engine_type_tests(source: str, engines: set[str]) -> list[int]:
    """Lines of ``source`` that test an object against an engine class (``isinstance``/``issubclass``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
            named = {
                n.id if isinstance(n, ast.Name) else n.attr
                for n in ast.walk(node.args[1])
                if isinstance(n, ast.Name | ast.Attribute)
            }
            if node.func.id in ("isinstance", "issubclass") and named & engines:
                lines.append(node.lineno)
    return lines


def test_what_an_engine_can_do_is_declared_never_tested_by_type() -> None:
    """Users read the members ``ChatEngine`` declares (``health``, ``runner_pid``, ``measure_verify_costs``), as
    Ollama's ``LlamaServer`` interface says what a backend can do: a type test outside the engine packages
    hides a contract, and a new engine silently loses what it was tested out of."""
    engines = _engine_classes()
    assert {"EmbeddedEngine", "LlamaServerEngine", "ChatEngine"} <= engines
    found = [
        f"{m}:{line}"
        for m, path in MODULES.items()
        if not m.startswith(ENGINE_PACKAGES)
        for line in _engine_type_tests(path.read_text(encoding="utf-8"), engines)
    ]
    assert found == [], f"type tests on an engine class outside the engine packages: {found}"
    seen = _engine_type_tests("ok = isinstance(e, (int, engine.LlamaServerEngine))\n", engines)
    assert seen == [1], "the checker must see a type test through a module and in a tuple"
