"""Reasons, notices and errors are values (issues 42, 50): code finds a plan's reason or a launch's notice by its
code and tells an error by its type or attributes, never by reading the sentence people read. The first tests read
the package's source for code that does; the others check that each place that keeps, drops or finds a reason or
a notice does it by code."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import clover_local
from clover_local.detect import parse_simulate
from clover_local.engine.schema_gbnf import SchemaRefused, schema_grammar
from clover_local.engine.schema_gbnf.regex_facts import Unsupported, within_lengths
from clover_local.errors import ChatTemplateRefused, EngineError, PlanError
from clover_local.gguf.model import describe_from_preset
from clover_local.plan.planner import make_plan
from clover_local.plan.pooled import pooled_plan, pooling_summary
from clover_local.plan.reasons import Notice, Reason, find_notice, find_reason
from clover_local.plan.speculation import speculate
from clover_local.plan.types import Plan, Wishes, assemble
from clover_local.presets import load_preset


def plan_speculation(plan: Plan, *args: Any) -> Plan:
    """``plan`` with only its speculation stage (``plan.speculation.speculate``) after the placement."""
    return assemble(plan, None, speculate(plan, *args))


PACKAGE = Path(clover_local.__file__).parent

TEXT_METHODS = frozenset(
    {
        "startswith",
        "endswith",
        "find",
        "rfind",
        "index",
        "rindex",
        "partition",
        "rpartition",
        "split",
        "rsplit",
        "count",
        "removeprefix",
        "removesuffix",
    }
)
"""Methods that read a string's text."""
ERROR_TEXT_ATTRIBUTES = frozenset({"args", "what", "fix", "message", "msg"})
"""Where an exception keeps its sentences (``CloverError.what`` and ``fix``, ``Exception.args``)."""
REGEX_READERS = frozenset({"search", "match", "fullmatch", "findall", "finditer"})


HOLDERS = frozenset({"reasons", "notices", "warnings"})
"""Attributes that hold reasons or notices (``Plan.reasons``, ``Launch.notices``, ``AdaptedArgs.warnings``)."""
FINDERS = frozenset({"find_reason", "find_notice"})


class _TextReaders(ast.NodeVisitor):
    """Finds code that reads the text of a reason, a notice or a caught error.

    A reason or a notice: an element of ``<anything>.reasons`` (``.notices``, ``.warnings``: a loop or
    comprehension target over it, an index into it), what ``find_reason`` or ``find_notice`` returns, and their
    ``.text`` / ``str()``. An error: a name bound by ``except ... as
    NAME``, through ``str(NAME)``, ``repr(NAME)``, ``f"{NAME}"`` or ``NAME.what`` (``.args``, ``.fix``...), and
    names assigned from those. Reading: a text method (``startswith``, ``find``, ``partition``...) called on it,
    ``x in <it>`` / ``<it> in x`` with a string, or a regex run over it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reason_names: set[str] = set()
        self.error_names: set[str] = set()
        self.error_text_names: set[str] = set()
        self.found: list[str] = []

    # what holds a reason or an error's text
    def _is_reasons(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in HOLDERS

    def _is_reason(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.reason_names
        if isinstance(node, ast.Subscript):
            return self._is_reasons(node.value)
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FINDERS

    def _is_text(self, node: ast.expr) -> bool:
        """A reason's or an error's sentence (or the reason itself, whose ``str`` is its sentence)."""
        if self._is_reason(node):
            return True
        if isinstance(node, ast.Attribute):
            if node.attr == "text" and self._is_reason(node.value):
                return True
            if node.attr in ERROR_TEXT_ATTRIBUTES and isinstance(node.value, ast.Name):
                return node.value.id in self.error_names
        if isinstance(node, ast.Subscript):
            return self._is_text(node.value)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in ("str", "repr") and node.args:
                arg = node.args[0]
                return self._is_reason(arg) or (isinstance(arg, ast.Name) and arg.id in self.error_names)
            if isinstance(node.func, ast.Attribute) and node.func.attr in (
                "lower",
                "upper",
                "casefold",
                "strip",
            ):
                return self._is_text(node.func.value)
        if isinstance(node, ast.JoinedStr):
            return any(
                isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and self._is_text(v.value)
                for v in node.values
            )
        if isinstance(node, ast.Name):
            return node.id in self.error_text_names or node.id in self.error_names
        return False

    def _say(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}: {what}")

    # where names come to hold them
    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.error_names.add(node.name)
        self.generic_visit(node)

    def _bind_targets(self, target: ast.expr, source: ast.expr) -> None:
        if self._is_reasons(source) and isinstance(target, ast.Name):
            self.reason_names.add(target.id)
        elif (
            isinstance(source, ast.Call)
            and isinstance(source.func, ast.Name)
            and source.func.id == "enumerate"
            and source.args
            and self._is_reasons(source.args[0])
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and isinstance(target.elts[1], ast.Name)
        ):
            self.reason_names.add(target.elts[1].id)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._bind_targets(node.target, node.iter)
        self.generic_visit(node)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        """Its loops first: they bind the names its element reads."""
        for generator in node.generators:
            self.visit(generator)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_For(self, node: ast.For) -> None:
        self._bind_targets(node.target, node.iter)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                if self._is_reason(node.value):
                    self.reason_names.add(target.id)
                elif self._is_text(node.value) and not isinstance(node.value, ast.Name):
                    self.error_text_names.add(target.id)
            elif isinstance(target, ast.Tuple) and self._is_text(node.value):
                self.error_text_names.update(e.id for e in target.elts if isinstance(e, ast.Name))
        self.generic_visit(node)

    # what reads them
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr in TEXT_METHODS and self._is_text(func.value):
                self._say(node, f".{func.attr}() on a reason's or an error's text")
            if (
                func.attr in REGEX_READERS
                and isinstance(func.value, ast.Name)
                and func.value.id == "re"
                and any(self._is_text(a) for a in node.args[1:2])
            ):
                self._say(node, f"re.{func.attr}() over a reason's or an error's text")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if isinstance(op, ast.In | ast.NotIn):
                left, right = sides[i], sides[i + 1]
                if self._is_text(right) or (self._is_reasons(right) and _is_string(left)):
                    self._say(node, "`in` searches a reason's or an error's text")
                elif self._is_text(left) and not self._is_reason(left):
                    self._say(node, "a reason's or an error's text looked up by its sentence")
        self.generic_visit(node)


def _is_string(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant | ast.JoinedStr) and not isinstance(
        getattr(node, "value", ""), bytes
    )


def text_readers(source: str, path: Path) -> list[str]:
    """Where ``source`` reads a reason's or an error's text (file:line: what), function by function."""
    found: list[str] = []
    tree = ast.parse(source)
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for scope in [tree, *scopes]:
        visitor = _TextReaders(path)
        body = scope.body if isinstance(scope, ast.Module) else [scope]
        for statement in body:
            if scope is tree and isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue  # each function is read on its own, with its own names
            visitor.visit(statement)
        found += visitor.found
    return sorted(set(found))


def test_no_code_in_the_package_reads_a_reasons_or_an_errors_text() -> None:
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in text_readers(path.read_text(encoding="utf-8"), path)
    ]
    assert not found, "find reasons and notices by code, errors by type or attribute:\n" + "\n".join(found)


def _sentences_as_notices(source: str) -> list[str]:
    """Where ``source`` keeps notices as bare sentences: something named ``notices`` or ``warnings`` annotated
    ``tuple[str, ...]`` (or a list of them: ``list[str]`` is the saved compare report's, what was shown)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target = (
            node.target if isinstance(node, ast.AnnAssign) else node if isinstance(node, ast.arg) else None
        )
        annotation = getattr(node, "annotation", None)
        name = getattr(target, "attr", None) or getattr(target, "id", None) or getattr(target, "arg", None)
        if name in ("notices", "warnings") and annotation is not None:
            text = ast.unparse(annotation)
            if "tuple[str" in text or text.startswith("list[tuple[str"):
                found.append(f"{node.lineno}: {name}: {text}")
    return found


def test_no_notice_in_the_package_is_a_bare_sentence() -> None:
    """A launch's notices and a llama-server's adapted-flag warnings are :class:`Notice` values (a code and a
    text), never ``tuple[str, ...]``; so is why a llama-server could not be asked."""
    from clover_local.facts import ServerFacts

    found = [
        f"{path.relative_to(PACKAGE.parent)}:{hit}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in _sentences_as_notices(path.read_text(encoding="utf-8"))
    ]
    assert not found, "carry a code with each notice (plan.reasons.Notice):\n" + "\n".join(found)
    assert _sentences_as_notices("notices: tuple[str, ...] = ()")
    assert _sentences_as_notices("def f(warnings: tuple[str, ...]) -> None: ...")
    assert not _sentences_as_notices("notices: tuple[Notice, ...] = ()")
    assert ServerFacts.__annotations__["problem"] == "Notice | None"


@pytest.mark.parametrize(
    "snippet",
    [
        'kept = [r for r in plan.reasons if not r.startswith("1 slot")]',
        'kept = [r for r in plan.reasons if not r.text.startswith("1 slot")]',
        'why = next((r for r in plan.reasons if "Does not fit" in r), "")',
        'at = next((i for i, r in enumerate(reasons_of.reasons) if r.text.startswith("RAM:")), 0)',
        'found = find_reason(plan.reasons, "ram")\nok = found.text.startswith("RAM")',
        "first = plan.reasons[0].text.find('x')",
        'ok = "Self-speculative" in plan.reasons',
        "said = launch.notices[0]\nok = said.text.startswith('Loading')",
        'ok = any("dropped" in n.text for n in opened.notices)',
        'ok = [n for n in adapted.warnings if n.text.endswith("dropped.")]',
        'found = find_notice(opened.notices, "engine")\nok = "llama-server" in found.text',
        'skip = [n for n in opened.notices if n.text != said and "Engine" in n]',
        "try:\n    f()\nexcept ValueError as exc:\n    keyword, _, why = str(exc).partition(': ')",
        "try:\n    f()\nexcept ValueError as exc:\n    if 'refused' in exc.what:\n        pass",
        "try:\n    f()\nexcept ValueError as exc:\n    text = str(exc)\n    ok = 'refused' in text",
        "try:\n    f()\nexcept ValueError as exc:\n    ok = re.search('held', str(exc))",
        "try:\n    f()\nexcept ValueError as exc:\n    ok = f'{exc}'.startswith('held')",
    ],
)
def test_the_check_finds_text_read(snippet: str) -> None:
    """The check itself: each of these reads a sentence."""
    assert text_readers(snippet, PACKAGE / "example.py"), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        'kept = [r for r in plan.reasons if r.code != "slots"]',
        'found = find_reason(plan.reasons, "does-not-fit")\nwhy = found.text if found else ""',
        'lines = [f"  - {r.text}" for r in plan.reasons]',
        'for n in opened.notices:\n    if n.code != "engine":\n        print(f"note: {n.text}")',
        'said = find_notice(safer.notices, "safer-launch")\nwhy = said.text if said else ""',
        "try:\n    f()\nexcept ValueError as exc:\n    raise OtherError(f'{exc}.') from None",
        "try:\n    f()\nexcept ValueError as exc:\n    notify(str(exc))",
        "if text.startswith('data:'):\n    pass",
    ],
)
def test_the_check_lets_code_by_code_and_showing_text_pass(snippet: str) -> None:
    assert not text_readers(snippet, PACKAGE / "example.py"), snippet


def test_find_a_notice_by_code() -> None:
    notices = (Notice("engine", "Engine: embedded (as asked)."), Notice("flag-dropped", "--x: dropped."))
    assert find_notice(notices, "flag-dropped") == notices[1]
    assert find_notice(notices, "safer-launch") is None
    assert str(notices[0]) == "Engine: embedded (as asked)."


def test_find_and_drop_go_by_code() -> None:
    reasons = (Reason("slots", "2 slots."), Reason("ram", "RAM: 1 GiB."), Reason("slots", "1 slot."))
    assert find_reason(reasons, "ram") == Reason("ram", "RAM: 1 GiB.")
    assert find_reason(reasons, "does-not-fit") is None
    assert str(reasons[1]) == "RAM: 1 GiB."


# --- each place that keeps, drops or finds a reason goes by its code --------------------------------------
# Every sentence is reworded first: a filter that read the text would miss them all.


CLOVER = load_preset("clover-35b-a3b")


def _reworded(reasons: tuple[Reason, ...]) -> tuple[Reason, ...]:
    return tuple(replace(r, text=f"Reworded {i}: {r.text[::-1]}") for i, r in enumerate(reasons))


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_the_mtp_launch_trades_the_slots_reason_by_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch drafting with an embedded MTP head plans one slot, and its reason replaces the planner's."""
    from clover_local.decide import MTP_ONE_SLOT
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.plan import planner
    from clover_local.testing.models import tiny_mtp_model

    choose_slots = planner.choose_slots

    def reworded(*args, **kwargs):  # type: ignore[no-untyped-def]
        fit, why = choose_slots(*args, **kwargs)
        return fit, f"Reworded: {why[::-1]}"

    monkeypatch.setattr(planner, "choose_slots", reworded)
    model, _ = tiny_mtp_model("embedded")
    request = LaunchRequest(model=str(model), ctx=2048, spec="mtp", engine="embedded", parallel=None)
    launch = decide_launch(request, machine=parse_simulate("ram=32G,cpu=8"))
    assert launch.plan.parallel == 1
    assert [r for r in launch.plan.reasons if r.code == "slots"] == [MTP_ONE_SLOT]


def test_speculation_off_drops_the_planners_ngram_reason_by_code() -> None:
    plan = make_plan(parse_simulate("ram=64G,cpu=8"), CLOVER, None, Wishes(quant="Q4_K_M"))
    assert find_reason(plan.reasons, "speculation-ngram") is not None
    plan = replace(plan, reasons=_reworded(plan.reasons))
    off = plan_speculation(plan, describe_from_preset(CLOVER, "Q4_K_M"), (), "off")
    assert find_reason(off.reasons, "speculation-ngram") is None
    assert [r.code for r in off.reasons] == [
        *(r.code for r in plan.reasons if r.code != "speculation-ngram"),
        "speculation-off",
    ]


def test_run_says_how_a_diffusion_model_decodes_by_code() -> None:
    from clover_local.commands.run import plan_notices
    from clover_local.gguf.header import read_local_header
    from clover_local.testing.models import tiny_model

    header = read_local_header(tiny_model("llada-moe"))
    plan = make_plan(parse_simulate("ram=16G,cpu=4"), load_preset("gemma3-270m"), header, Wishes(ctx=512))
    said = [r.text for r in plan.reasons if r.code == "diffusion"]
    assert plan_notices(plan) == tuple(Notice("diffusion", s) for s in said)
    assert said[0].startswith("Diffusion decoding (llada-moe)")
    reworded = replace(
        plan,
        reasons=(
            Reason("ram", "Diffusion decoding (a look-alike)."),
            Reason("diffusion", "Reworded: 8 steps."),
        ),
    )
    assert plan_notices(reworded) == (Notice("diffusion", "Reworded: 8 steps."),)
    assert plan_notices(replace(reworded, diffusion=None)) == ()


def test_pooling_places_its_reasons_and_its_speed_by_code() -> None:
    """The pooled plan's reasons: the planner's with the speed on the devices alone replaced by one with the
    network, the pooling reasons before the RAM line, and the comparison with this machine alone last."""

    def reworded_planner(*args, **kwargs):  # type: ignore[no-untyped-def]
        plan = make_plan(*args, **kwargs)
        return replace(plan, reasons=_reworded(plan.reasons))

    machine = parse_simulate("gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@10.0.0.2:50052")
    plan = pooled_plan(reworded_planner, machine, CLOVER, None, Wishes(), None, models=None)
    assert plan.rpc_servers
    codes = [r.code for r in plan.reasons]
    ram = codes.index("ram")
    assert codes[ram - 2 : ram] == ["pooling", "rpc-trust"] and codes[-1] == "versus-alone"
    speed = find_reason(plan.reasons, "speed-estimate")
    assert speed is not None and "with the network in the path" in speed.text
    assert codes.count("speed-estimate") == 1


def test_the_pooling_summary_finds_the_workers_left_out_by_code() -> None:
    plan = make_plan(parse_simulate("ram=64G,cpu=8"), CLOVER, None, Wishes(quant="Q4_K_M"))
    left_out = replace(
        plan,
        alone_tokens_per_s=10.0,
        rpc_servers=(),
        reasons=(
            Reason("ram", "Workers not used (a look-alike)."),
            Reason("workers-unused", "Reworded: alone."),
        ),
    )
    assert pooling_summary(left_out) == "Reworded: alone."
    assert pooling_summary(replace(left_out, reasons=())) is None


def test_compare_refuses_a_contender_that_does_not_fit_with_the_advice_found_by_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clover_local import launch as launch_module
    from clover_local.compare import openers

    plan = make_plan(parse_simulate("ram=16G"), CLOVER, None, Wishes(quant="Q8_0"))
    assert not plan.fits and find_reason(plan.reasons, "does-not-fit") is not None
    reasons = (Reason("ram", "Does not fit (a look-alike)."), Reason("does-not-fit", "Reworded: ram short."))
    monkeypatch.setattr(openers, "local_model", lambda contender, machine, progress: (None, Path("x.gguf")))
    monkeypatch.setattr(
        launch_module,
        "decide_launch",
        lambda request, machine=None: SimpleNamespace(plan=replace(plan, reasons=reasons)),
    )
    contender, options = SimpleNamespace(name="big"), SimpleNamespace(ctx=None, engine=None)
    with pytest.raises(PlanError, match="big does not fit this machine: Reworded: ram short"):
        openers.open_local(contender, options, None, lambda progress: None)  # type: ignore[arg-type]


# --- notices carry codes ------------------------------------------------------------------------------------


def _help(*options: str) -> str:
    """A llama-server ``--help`` listing ``options`` (as ``common_arg::to_string`` prints them)."""
    return "\n".join(["----- common params -----", "", *(o.ljust(40) + "an option" for o in options)])


def test_a_launch_fitted_to_a_llama_server_carries_a_code_per_flag_changed(tmp_path: Path) -> None:
    from clover_local.decide import _fitted_argv
    from clover_local.facts import ServerFacts
    from clover_local.launch_types import Runner
    from clover_local.llamacpp.binary import Capabilities, ServerBinary, parse_help

    flags = parse_help(
        _help("-m,    --model FNAME", "-c,    --ctx-size N", "-ot,   --override-tensor PATTERN")
    )
    caps = Capabilities(version="b1-test", build_number=1, commit="test", flags=flags)
    binary = ServerBinary(tmp_path / "llama-server", "test")
    runner = Runner("llama-server", "as asked", binary)
    argv = ["-m", "x.gguf", "-c", "512", "--load-mode", "mmap", "--n-cpu-moe", "3"]
    asked = SimpleNamespace(servers={str(binary.path): ServerFacts(caps)}, repack_safe_here=True)
    fitted, said = _fitted_argv(asked, runner, argv)  # type: ignore[arg-type]
    assert fitted is not None and "--load-mode" not in fitted and "--override-tensor" in fitted
    assert [n.code for n in said] == ["flag-dropped", "flag-renamed"]
    assert said[0].text == "This llama-server (b1-test) does not accept --load-mode mmap: dropped."

    unasked = ServerFacts(None, Notice("server-unasked", "Running it failed."), caps, tmp_path / "arg.cpp")
    asked = SimpleNamespace(servers={str(binary.path): unasked}, repack_safe_here=True)
    _, said = _fitted_argv(asked, runner, argv)  # type: ignore[arg-type]
    assert said[0].code == "flags-from-arg-cpp"
    assert said[0].text.startswith(
        "Running it failed. Its flags were checked against the arg.cpp kept beside"
    )


def test_the_engine_notice_and_why_only_llama_server_runs_it_carry_codes() -> None:
    from clover_local.decide import _needs_llama_server, choose_runner, engine_notice
    from clover_local.errors import UsageError
    from clover_local.launch import LaunchRequest
    from clover_local.launch_types import Runner

    said = engine_notice(Runner("embedded", "as asked"))
    assert said == Notice("engine", "Engine: embedded (as asked).")
    assert _needs_llama_server(LaunchRequest(), None) is None
    rpc = _needs_llama_server(LaunchRequest(rpc="10.0.0.2:50052"), None)
    assert rpc is not None and rpc.code == "needs-rpc" and "--rpc 10.0.0.2:50052" in rpc.text
    drafter = _needs_llama_server(LaunchRequest(spec="dflash"), None)
    assert drafter is not None and drafter.code == "needs-drafter"
    with pytest.raises(UsageError, match="cannot run this: the plan pools other machines' devices"):
        choose_runner(LaunchRequest(rpc="10.0.0.2:50052", engine="embedded"), None)


def test_a_llama_servers_template_is_the_name_its_argv_gives_not_sniffed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A built-in template is known by the ``--chat-template`` the launch gave (the plan passes only names), not
    by looking for Jinja syntax in what ``/props`` says; without one, ``/props`` holds the GGUF's Jinja."""
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.llamacpp.server import LlamaServerProcess
    from clover_local.llamacpp.server_engine import LlamaServerEngine

    def engine(argv: list[str], props: dict[str, str]) -> LlamaServerEngine:
        process = LlamaServerProcess(
            ServerBinary(Path("llama-server"), "test"),
            argv,
            host="127.0.0.1",
            port=1,
            api_key=None,
            warnings=(),
            on_log=None,
        )
        started = LlamaServerEngine(process, owns_process=False)
        monkeypatch.setattr(started, "_get", lambda path: props)
        return started

    named = engine(["-m", "x.gguf", "--chat-template", "gemma"], {"chat_template": "no braces here"})
    assert (named.template.kind, named.template.name) == ("builtin", "gemma")
    props = engine(["-m", "x.gguf"], {"chat_template": "plain words"}).template
    assert (props.kind, props.source) == ("jinja", "plain words")
    assert engine(["-m", "x.gguf"], {}).template.kind == "completion"


# --- errors are told by type or attribute ------------------------------------------------------------------


def test_a_pattern_that_cannot_meet_a_length_names_the_keyword_as_an_attribute() -> None:
    with pytest.raises(Unsupported) as info:
        within_lengths("^[a-z]{8}$", 0, 4)
    assert info.value.keyword == "maxLength" and str(info.value) == "no match of the pattern is that short"
    with pytest.raises(SchemaRefused) as refused:
        schema_grammar({"type": "string", "pattern": "^[a-z]{8}$", "maxLength": 4})
    assert refused.value.keyword == "maxLength"
    assert refused.value.detail == (
        "cannot be enforced together with 'pattern': no match of the pattern is that short."
    )
    assert Unsupported("unbalanced parentheses").keyword is None


def test_a_template_that_refuses_is_told_by_its_type() -> None:
    from clover_local.engine import templates
    from clover_local.engine.types import ChatMessage

    with pytest.raises(ChatTemplateRefused):
        templates.render_jinja(
            "{{ raise_exception('no') }}", [ChatMessage("user", "x")], bos_token="", eos_token=""
        )

    def refuses(messages: object) -> str:
        raise ChatTemplateRefused("Reworded: not these.")

    templates.check_template(refuses)  # a template that refuses works; the messages are the trouble

    def broken(messages: object) -> str:
        raise EngineError("The chat template refused these messages (a look-alike): it is broken.")

    with pytest.raises(EngineError):
        templates.check_template(broken)
