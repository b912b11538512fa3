"""The core of ``clover-local compare`` without a model: every check on replies that pass, fail and are malformed;
tasks files refused before any model loads (with the line and the fix); each limit on hostile input; the
statistics against known values; the report's JSON round trip, table and picture; contenders as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clover_local.compare.checks import Reply, json_equal, run_check
from clover_local.compare.contenders import parse_contender, parse_contenders
from clover_local.compare.picture import svg_picture, text_picture
from clover_local.compare.report import (
    CompareReport,
    ContenderResult,
    TaskResult,
    format_table,
    load_report,
    report_from_json,
    save_report,
)
from clover_local.compare.saferegex import SafeRegex
from clover_local.compare.stats import mcnemar_exact, paired, spread, wilson
from clover_local.compare.tasks import (
    CHECK_TYPES,
    Check,
    Limits,
    TaskFileError,
    load_tasks,
    parse_tasks,
)
from clover_local.engine.types import ToolCall
from clover_local.errors import UsageError


@pytest.fixture(scope="module")
def regex() -> SafeRegex:
    with SafeRegex(timeout_s=2.0) as r:
        yield r  # type: ignore[misc]


def _check(
    kind: str, value: object = None, text: str = "", calls: tuple[ToolCall, ...] = (), *, regex: SafeRegex
):
    return run_check(Check(kind, value), Reply(text, calls), regex)  # type: ignore[arg-type]


PERSON = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
CASES = [
    # (type, value, passing reply, failing reply, malformed reply)
    ("contains", "Paris", "It is Paris.", "It is paris.", "\x00\ufffd"),
    ("icontains", "paris", "PARIS!", "Lyon", "\ufffd" * 3),
    ("equals", "yes", "  yes\n", "yes, sure", ""),
    ("regex", r"\b42\b", "the answer is 42.", "4242", "\ud7ff"),
    ("is-json", PERSON, '```json\n{"age": 3}\n```', '{"age": "three"}', '{"age": 3'),
    ("contains-json", PERSON, 'Here: {"age": 3} done', 'Here: {"name": "x"}', "{{{ [[[ not json"),
]


@pytest.mark.parametrize(("kind", "value", "good", "bad", "broken"), CASES, ids=[c[0] for c in CASES])
def test_each_text_check_passes_fails_and_survives_a_malformed_reply(
    regex: SafeRegex, kind: str, value: object, good: str, bad: str, broken: str
) -> None:
    assert _check(kind, value, good, regex=regex).passed
    failed = _check(kind, value, bad, regex=regex)
    assert not failed.passed and failed.why
    malformed = _check(kind, value, broken, regex=regex)
    assert not malformed.passed and malformed.why


def test_is_json_without_a_schema_takes_any_json_and_says_why_not(regex: SafeRegex) -> None:
    assert _check("is-json", None, "[1, 2]", regex=regex).passed
    result = _check("is-json", None, 'Sure! {"a": 1}', regex=regex)
    assert not result.passed and "not JSON" in result.why
    deep = "[" * 100_000 + "]" * 100_000
    assert not _check("is-json", None, deep, regex=regex).passed  # too deep: a failed check, not a crash
    assert _check("contains-json", None, 'x {"a": [1, {"b": 2}]} y', regex=regex).passed


def test_tool_call_passes_with_at_least_those_arguments_equal_as_json(regex: SafeRegex) -> None:
    want = {"name": "get_weather", "arguments": {"city": "Paris"}}
    good = (ToolCall("1", "get_weather", '{"city": "Paris", "unit": "celsius"}'),)
    assert _check("tool-call", want, calls=good, regex=regex).passed
    cases = {
        "calls no tool": (),
        "not get_weather": (ToolCall("1", "get_time", "{}"),),
        "city=": (ToolCall("1", "get_weather", '{"city": "Lyon"}'),),
        "not JSON": (ToolCall("1", "get_weather", '{"city": "Par'),),
        "not an object": (ToolCall("1", "get_weather", "[1]"),),
    }
    for why, calls in cases.items():
        result = _check("tool-call", want, calls=calls, regex=regex)
        assert not result.passed and why in result.why, (why, result)
    assert json_equal(1, 1.0) and not json_equal(True, 1) and not json_equal({"a": 1}, {"a": 1, "b": 2})


def test_every_check_type_is_covered() -> None:
    covered = {c[0] for c in CASES} | {"tool-call"}
    assert covered == set(CHECK_TYPES)


def test_a_regex_that_backtracks_forever_fails_its_check_and_the_next_one_runs() -> None:
    with SafeRegex(timeout_s=1.0) as regex:
        hostile = _check("regex", r"(a+)+$", "a" * 60 + "b", regex=regex)
        assert not hostile.passed and "ran past 1 s" in hostile.why
        assert _check("regex", r"b$", "a" * 60 + "b", regex=regex).passed


# -- tasks files --------------------------------------------------------------------------------------------


def _jsonl(*tasks: object) -> bytes:
    return "".join(json.dumps(t) + "\n" for t in tasks).encode()


GOOD = {"id": "a", "prompt": "Capital of France?", "assert": [{"type": "icontains", "value": "paris"}]}


@pytest.mark.parametrize(
    ("bad", "line", "said", "fix"),
    [
        (
            {"id": "b", "prompt": "x", "assert": [{"type": "containz", "value": "x"}]},
            3,
            "unknown check",
            "Checks:",
        ),
        (
            {"id": "b", "prompt": "x", "assert": [{"type": "regex", "value": "(unclosed"}]},
            3,
            "does not compile",
            "regular",
        ),
        (
            {"id": "b", "prompt": "x", "assert": [{"type": "is-json", "value": {"type": "objekt"}}]},
            3,
            "not valid JSON Schema",
            "Fix the schema",
        ),
        (
            {"id": "a", "prompt": "x", "assert": [{"type": "contains", "value": "x"}]},
            3,
            "used already",
            "own id",
        ),
        ({"id": "b", "assert": [{"type": "contains", "value": "x"}]}, 3, "exactly one of prompt", None),
        (
            {
                "id": "b",
                "prompt": "x",
                "assert": [{"type": "tool-call", "value": {"name": "f"}}],
                "tools": [{"name": "g"}],
            },
            3,
            "do not offer",
            None,
        ),
    ],
)
def test_a_bad_task_is_refused_with_its_line_and_what_to_fix(
    bad: dict[str, object], line: int, said: str, fix: str | None
) -> None:
    data = _jsonl(GOOD) + b"# a comment line\n" + _jsonl(bad)
    with pytest.raises(TaskFileError) as caught:
        parse_tasks(data, "mine.jsonl")
    assert f"mine.jsonl line {line}:" in caught.value.what and said in caught.value.what
    if fix:
        assert caught.value.fix and fix in caught.value.fix


def test_yaml_tasks_with_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(
        "tasks:\n"
        "  - id: capital\n"
        "    prompt: Capital of France?\n"
        "    assert:\n"
        "      - {type: icontains, value: paris}\n"
        "  - id: weather\n"
        "    messages:\n"
        "      - {role: system, content: Use tools.}\n"
        "      - {role: user, content: 'Weather in Paris?'}\n"
        "    tools:\n"
        "      - {name: get_weather, parameters: {type: object, properties: {city: {type: string}}}}\n"
        "    assert:\n"
        "      - type: tool-call\n"
        "        value: {name: get_weather, arguments: {city: Paris}}\n"
        "  - id: broken\n"
        "    prompt: x\n"
        "    assert:\n"
        "      - {type: nope}\n",
        encoding="utf-8",
    )
    with pytest.raises(TaskFileError, match=r"tasks.yaml line 15: unknown check 'nope'"):
        load_tasks(str(path))
    path.write_text("\n".join(path.read_text().splitlines()[:14]) + "\n", encoding="utf-8")
    tasks = load_tasks(str(path))
    assert tasks.ids == ("capital", "weather") and [t.line for t in tasks.tasks] == [2, 6]
    assert tasks.tasks[1].tools[0].name == "get_weather" and tasks.tasks[1].messages[0].role == "system"


def test_yaml_aliases_are_refused() -> None:
    bomb = b"a: &a [x, x]\nb: &b [*a, *a]\ntasks: [*b]\n"
    with pytest.raises(TaskFileError, match="aliases"):
        parse_tasks(bomb, "bomb.yaml")


def test_jsonl_works_without_pyyaml_and_yaml_says_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_bytes(_jsonl(GOOD))
    (tmp_path / "t.yaml").write_text("- {id: a, prompt: x, assert: [{type: contains, value: x}]}\n")
    code = (
        "import sys; sys.modules['yaml'] = None\n"
        "from clover_local.compare.tasks import load_tasks, TaskFileError\n"
        f"print(load_tasks({str(tmp_path / 't.jsonl')!r}).ids)\n"
        "try:\n"
        f"    load_tasks({str(tmp_path / 't.yaml')!r})\n"
        "except TaskFileError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "('a',)" in out and "needs PyYAML" in out and "JSONL" in out


def test_limits_on_a_hostile_tasks_file(tmp_path: Path) -> None:
    small = Limits(max_file_bytes=2000, max_tasks=3, max_checks=2, max_pattern_chars=10)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b" " * 2001)
    with pytest.raises(TaskFileError, match="over the 2000"):
        load_tasks(str(big), small)
    many = _jsonl(*({**GOOD, "id": str(i)} for i in range(4)))
    with pytest.raises(TaskFileError, match="4 tasks, over the 3"):
        parse_tasks(many, "many.jsonl", limits=small)
    checks = _jsonl({**GOOD, "assert": [{"type": "contains", "value": "x"}] * 3})
    with pytest.raises(TaskFileError, match="3 checks, over 2"):
        parse_tasks(checks, "c.jsonl", limits=small)
    long_regex = _jsonl({**GOOD, "assert": [{"type": "regex", "value": "a" * 11}]})
    with pytest.raises(TaskFileError, match="longer than 10"):
        parse_tasks(long_regex, "r.jsonl", limits=small)
    with pytest.raises(TaskFileError, match="not UTF-8"):
        parse_tasks(b"\xff\xfe", "x.jsonl")
    with pytest.raises(TaskFileError, match=r"nests too deeply|not JSON"):
        parse_tasks(b"[" * 100_000 + b"\n", "deep.jsonl")


def test_the_builtin_suite_is_a_few_dozen_checkable_agent_tasks() -> None:
    tasks = load_tasks("builtin")
    assert 24 <= len(tasks.tasks) <= 60
    kinds = {c.type for t in tasks.tasks for c in t.checks}
    assert kinds == set(CHECK_TYPES)
    assert sum(1 for t in tasks.tasks if t.tools) >= 5
    prefixes = {t.id.split("-")[0] for t in tasks.tasks}
    assert {"fact", "arith", "format", "json", "tool"} <= prefixes


# -- statistics ---------------------------------------------------------------------------------------------


def test_wilson_and_exact_mcnemar_against_known_values() -> None:
    lo, hi = wilson(7, 10)
    assert round(lo, 4) == 0.3968 and round(hi, 4) == 0.8922
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 1.0)
    assert mcnemar_exact(0, 6) == pytest.approx(0.03125)  # 2 * 0.5**6
    assert mcnemar_exact(0, 5) == pytest.approx(0.0625)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert 0 < mcnemar_exact(1500, 1400) < 1  # big counts stay exact (no float overflow)
    s = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s is not None and s.median == 3.0 and s.low == 2.0 and s.high == 4.0
    shown = paired("a", "b", {str(i): True for i in range(8)}, {str(i): False for i in range(8)})
    assert shown.shown and shown.verdict == "a is right more often"
    even = paired("a", "b", {"1": True, "2": False}, {"1": False, "2": True})
    assert not even.shown and even.verdict == "no difference shown"


# -- the report ---------------------------------------------------------------------------------------------


def _report() -> CompareReport:
    from clover_local.compare.checks import CheckResult

    def result(i: int, passed: bool, latency: float) -> TaskResult:
        return TaskResult(
            f"t{i}",
            0,
            "reply",
            ({"name": "f", "arguments": {"x": 1}},),
            passed,
            (CheckResult("contains", passed, "" if passed else "no"),),
            0.1,
            latency,
            50.0,
            10,
            5,
            "stop",
        )

    a = ContenderResult(
        "smollm2-135m", "preset", [result(i, i < 3, 1.0) for i in range(4)], peak_ram_bytes=2**27
    )
    b = ContenderResult("http://x/v1#m", "endpoint", [result(i, i < 2, 2.0) for i in range(4)])
    c = ContenderResult("hf:o/r", "hf", error="refused: unknown architecture")
    return CompareReport(
        [a, b, c], "builtin", "d" * 64, [f"t{i}" for i in range(4)], {"max_tokens": 8}, complete=True
    )


def test_the_json_report_has_what_the_issue_names_and_reads_back(tmp_path: Path) -> None:
    report = _report()
    data = report.to_json()
    first = data["contenders"][0]
    for key in ("name", "accuracy", "passed", "total", "ttft_s", "decode_tok_s", "tasks"):
        assert key in first
    task = first["tasks"][0]
    for key in ("id", "reply", "tool_calls", "passed", "asserts", "ttft_s", "latency_s"):
        assert key in task
    assert task["tool_calls"] == [{"name": "f", "arguments": {"x": 1}}]
    assert task["asserts"][0]["type"] == "contains" and "passed" in task["asserts"][0]
    assert first["accuracy"] == 0.75 and data["pairs"][0]["verdict"] == "no difference shown"
    path = tmp_path / "r.json"
    save_report(report, path)
    again = load_report(path)
    assert again.to_json() == data
    with pytest.raises(ValueError):
        report_from_json({"kind": "something else"})
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UsageError, match="not a saved compare report"):
        load_report(tmp_path / "bad.json")


def test_the_table_and_the_picture() -> None:
    report = _report()
    table = format_table(report)
    assert "3/4" in table and "75% (30%-95%)" in table and "2.00x" in table  # latency ratio to the first
    assert "no difference shown" in table and "refused: unknown architecture" in table
    picture = text_picture(report)
    assert "A  smollm2-135m: 75%, 1.00 s" in picture and "B  http://x/v1#m" in picture
    svg = svg_picture(report)
    assert svg.startswith("<svg") and "smollm2-135m" in svg and svg.count("<circle") == 2


# -- contenders ---------------------------------------------------------------------------------------------


def test_contenders_as_written() -> None:
    assert parse_contender("smollm2-135m").kind == "preset"
    assert parse_contender("./m.gguf").kind == "gguf" and parse_contender("/x/m.gguf").kind == "gguf"
    hf = parse_contender("hf:unsloth/Qwen3-GGUF:Q4_K_M")
    assert (hf.kind, hf.target, hf.quant) == ("hf", "unsloth/Qwen3-GGUF", "Q4_K_M")
    assert parse_contender("hf:a/b").quant is None
    ep = parse_contender("http://localhost:11434#qwen3:30b-a3b")
    assert (ep.kind, ep.target, ep.model) == ("endpoint", "http://localhost:11434/v1", "qwen3:30b-a3b")
    assert parse_contender("https://api.example.com/v1/#gpt").target == "https://api.example.com/v1"
    with pytest.raises(UsageError, match="names no model"):
        parse_contender("http://localhost:8080/v1")
    with pytest.raises(UsageError, match="user name or password") as caught:
        parse_contender("http://me:sk-secret@host/v1#m")
    assert "sk-secret" not in str(caught.value)
    with pytest.raises(UsageError, match="not a Hugging Face GGUF repo"):
        parse_contender("hf:not a repo")
    with pytest.raises(UsageError, match="Named twice"):
        parse_contenders(["a", "a"])
    with pytest.raises(UsageError, match="at most 8"):
        parse_contenders([f"p{i}" for i in range(9)])


def test_the_progress_line_says_what_runs_and_the_time_left_and_does_not_flood_a_log() -> None:
    import io

    from clover_local.commands.compare import ProgressLine
    from clover_local.compare.options import Progress

    log = io.StringIO()
    line = ProgressLine(log)
    for _ in range(500):  # a download reports many times a second
        line(Progress("downloading", "hf:a/b", message="downloading 10%"))
    line(Progress("task", "smollm2-135m", "capital", 3, 12, 90.0))
    line(Progress("failed", "http://x/v1#m", done=3, total=12, message="Could not reach the endpoint"))
    lines = log.getvalue().splitlines()
    assert lines[0] == "hf:a/b: downloading 10%" and len([x for x in lines if "downloading" in x]) == 1
    assert lines[1] == "[######------------------] 3/12 smollm2-135m: capital, about 01:30 left"
    assert lines[2].endswith("could not run") and lines[3] == "  Could not reach the endpoint"
