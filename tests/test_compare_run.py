"""``compare`` with real models: the real SmolLM2 135M and Gemma 3 270M, each planned for this machine and loaded
through ``open_launch``, one at a time (asserted from the engines' own open and close, never from timing); an
interrupted run resumed without asking a finished task again; an endpoint that is down and a model that does not
fit are errors for that contender alone; an ``hf:`` repo of an architecture nothing here runs is refused before
its bytes; ``--show`` prints a saved report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers_compare import TASKS, Recorder, prompt_of, write_tasks
from helpers_serve import llama_server_path  # resolved at import, before the user folders move

from clover_local import model_files
from clover_local.cli import main
from clover_local.compare.contenders import parse_contenders
from clover_local.compare.options import CompareOptions, Progress
from clover_local.compare.report import load_report, save_report
from clover_local.compare.runner import run_compare
from clover_local.compare.tasks import load_tasks
from clover_local.llamacpp.server import free_port

if TYPE_CHECKING:
    from hub_server import HubServer

pytestmark = pytest.mark.slow

OPTIONS = CompareOptions(max_tokens=24, ctx=1024)


def _no_two_at_once(recorder: Recorder) -> None:
    assert recorder.most_open == 1, recorder.events
    opened = [e for e in recorder.events if e[0] in ("opening", "close", "failed")]
    for first, second in zip(opened[::2], opened[1::2], strict=False):
        assert first[0] == "opening" and second[0] in ("close", "failed") and first[1] == second[1], opened


def test_local_contenders_run_one_at_a_time_on_their_own_plans(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    tasks = load_tasks(str(write_tasks(tmp_path)))
    contenders = parse_contenders([str(smollm2_path), "gemma3-270m"])
    recorder = Recorder()
    steps: list[Progress] = []
    report = run_compare(contenders, tasks, OPTIONS, opener=recorder, on_progress=steps.append)
    _no_two_at_once(recorder)
    # Every ask of a contender falls between its open and its close.
    kinds = [(e[0], e[1]) for e in recorder.events]
    for name in (c.name for c in contenders):
        start, end = kinds.index(("opening", name)), kinds.index(("close", name))
        asks = [i for i, e in enumerate(recorder.events) if e[0] == "ask" and e[1] == name]
        assert len(asks) == len(TASKS) and all(start < i < end for i in asks)
    assert report.complete
    smol = report.contender(str(smollm2_path))
    assert smol is not None and smol.error is None and smol.total == len(TASKS)
    by_id = {t.id: t for t in smol.tasks}
    assert by_id["capital"].passed and "paris" in by_id["capital"].reply.lower()
    assert not by_id["secret"].passed and by_id["secret"].asserts[0].why
    assert all(
        t.latency_s and t.ttft_s is not None and t.tokens_in > 0 and t.tokens_out > 0 for t in smol.tasks
    )
    assert smol.peak_ram_bytes and smol.peak_ram_bytes > 0 and smol.engine.startswith("embedded")
    gemma = report.contender("gemma3-270m")
    assert gemma is not None and gemma.total == len(TASKS) and gemma.peak_ram_bytes
    # Speed figures come from the run itself, side by side as ratios (no assertion on their size).
    data = report.to_json()
    assert data["contenders"][0]["decode_tok_s"] and data["contenders"][1]["decode_tok_s"]
    assert len(data["pairs"]) == 1 and "verdict" in data["pairs"][0]
    eta = [s.eta_s for s in steps if s.kind == "task" and s.eta_s is not None]
    assert eta and steps[-1].kind == "unloaded" and steps[-1].done == steps[-1].total == 2 * len(TASKS)


def test_an_interrupted_run_resumes_without_asking_a_finished_task_again(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    tasks = load_tasks(str(write_tasks(tmp_path)))
    contenders = parse_contenders([str(smollm2_path), str(gemma_path)])
    saved = tmp_path / "run.json"

    def ctrl_c_at_gemmas_second_task(p: Progress) -> None:
        if p.kind == "task" and p.contender == str(gemma_path) and p.task == TASKS[1]["id"]:
            raise KeyboardInterrupt

    first = Recorder()
    report = run_compare(
        contenders,
        tasks,
        OPTIONS,
        opener=first,
        on_progress=ctrl_c_at_gemmas_second_task,
        save=lambda r: save_report(r, saved),
    )
    assert not report.complete
    assert first.events[-1] == ("close", str(gemma_path))  # the model was unloaded on the way out
    kept = load_report(saved)
    assert not kept.complete and [len(c.tasks) for c in kept.contenders] == [len(TASKS), 1]

    second = Recorder()
    resumed = run_compare(
        contenders, tasks, OPTIONS, opener=second, previous=kept, save=lambda r: save_report(r, saved)
    )
    assert resumed.complete and [len(c.tasks) for c in resumed.contenders] == [len(TASKS), len(TASKS)]
    assert not second.asked(str(smollm2_path))  # finished: not even loaded again
    assert ("opening", str(smollm2_path)) not in second.events
    assert second.asked(str(gemma_path)) == [t["prompt"] for t in TASKS[1:]]
    assert prompt_of("capital") not in second.asked(str(gemma_path))
    assert [t.id for t in resumed.contenders[1].tasks] == [t["id"] for t in TASKS]

    with pytest.raises(Exception, match="other options"):
        run_compare(contenders, tasks, CompareOptions(max_tokens=5, ctx=1024), previous=load_report(saved))


def test_a_down_endpoint_and_a_model_that_does_not_fit_fail_alone(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    tasks = load_tasks(str(write_tasks(tmp_path, TASKS[:2])))
    down = f"http://127.0.0.1:{free_port()}/v1#some-model"
    contenders = parse_contenders([down, str(gemma_path), str(smollm2_path)])
    machine = model_files.detect("ram=3G")  # SmolLM2 fits in it, Gemma 3 270M does not
    recorder = Recorder()
    report = run_compare(contenders, tasks, OPTIONS, opener=recorder, machine=machine)
    _no_two_at_once(recorder)
    endpoint, gemma, smol = report.contenders
    assert endpoint.error and "Could not reach the endpoint" in endpoint.error and not endpoint.tasks
    assert gemma.error and "does not fit this machine" in gemma.error and not gemma.tasks
    assert smol.error is None and smol.total == 2 and smol.passed >= 1
    assert report.complete
    table = json.dumps(report.to_json())
    assert "Could not reach" in table and "does not fit" in table


def test_show_prints_a_saved_report(
    smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = write_tasks(tmp_path, TASKS[:1])
    out = tmp_path / "r.json"
    assert main(["compare", str(smollm2_path), "--tasks", str(tasks), "--max-tokens", "16", "--ctx", "1024",
                 "--json", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "1/1" in printed and out.with_suffix(".svg").read_text().startswith("<svg")
    assert main(["compare", "--show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "1/1" in shown and "accuracy" in shown
    data = json.loads(out.read_text())
    assert data["complete"] and data["contenders"][0]["tasks"][0]["id"] == "capital"


def test_a_bad_tasks_file_is_refused_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"id": "x", "prompt": "p", "assert": [{"type": "regex", "value": "(("}]}) + "\n"
    )
    assert main(["compare", "smollm2-135m", "no-such-preset", "--tasks", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl line 1: the regex '((' does not compile" in err and "Traceback" not in err


def test_an_hf_repo_is_fetched_and_run_and_one_nothing_here_runs_is_refused_before_its_bytes(
    hub_server: HubServer, tmp_path: Path
) -> None:
    from clover_local.fetch import cache
    from clover_local.testing.models import tiny_model, with_architecture

    known, unknown = "acme/Tiny-GGUF", "acme/Next-GGUF"
    hub_server.add_file(known, "Tiny-Q4_K_M.gguf", tiny_model("llama"))
    renamed = with_architecture(tiny_model("qwen35moe"), "clover-bd", tmp_path / "Next-Q4_K_M.gguf")
    hub_server.add_file(unknown, "Next-Q4_K_M.gguf", renamed)
    tasks = load_tasks(str(write_tasks(tmp_path, TASKS[:1])))
    contenders = parse_contenders([f"hf:{unknown}:Q4_K_M", f"hf:{known}"])  # no quant: Q4_K_M
    recorder = Recorder()
    report = run_compare(contenders, tasks, CompareOptions(max_tokens=8, ctx=512), opener=recorder)
    refused, fetched = report.contenders
    assert refused.error and "'clover-bd'" in refused.error and "Nothing was downloaded" in refused.error
    assert hub_server.bytes_served(unknown, "Next-Q4_K_M.gguf") < renamed.stat().st_size
    assert not (cache.repo_folder(unknown) / "blobs").is_dir() or not any(
        (cache.repo_folder(unknown) / "blobs").iterdir()
    )
    assert fetched.error is None and fetched.total == 1 and fetched.engine.startswith("embedded")
    assert recorder.most_open == 1


def test_ctrl_c_keeps_what_is_done_and_resume_goes_on(smollm2_path: Path, tmp_path: Path) -> None:
    """The command as a person runs it: SIGINT once the first task is saved; exit 130 saying how to go on;
    ``--resume FILE`` runs only what is left."""
    import os
    import signal
    import subprocess
    import sys

    from waiting import wait_until

    tasks = write_tasks(tmp_path)
    out = tmp_path / "run.json"
    cli = [sys.executable, "-m", "clover_local", "compare"]
    argv = [
        *cli,
        str(smollm2_path),
        "--tasks",
        str(tasks),
        "--max-tokens",
        "24",
        "--ctx",
        "1024",
        "--json",
        str(out),
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )

    def one_task_saved() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return bool(json.loads(out.read_text())["contenders"][0]["tasks"])
        except (OSError, ValueError, KeyError, IndexError):
            return False

    wait_until(one_task_saved, "the first task to be saved")
    proc.send_signal(signal.SIGINT)
    _out, stderr = proc.communicate(timeout=240)
    done = len(json.loads(out.read_text())["contenders"][0]["tasks"])
    if proc.returncode == 0:  # a fast machine finished every task before the signal came: nothing to resume
        assert done == len(TASKS)
        return
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert f"--resume {out}" in stderr and 1 <= done < len(TASKS)
    resumed = subprocess.run([*cli, "--resume", str(out)], capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    data = json.loads(out.read_text())
    assert data["complete"] and [t["id"] for t in data["contenders"][0]["tasks"]] == [t["id"] for t in TASKS]
    # Only what was left ran again: the progress lines name each remaining task once, and no finished one.
    ran = [line for line in resumed.stderr.splitlines() if f"{smollm2_path}: " in line and "load" not in line]
    for task in TASKS[:done]:
        assert not any(line.endswith(f": {task['id']}") or f": {task['id']}," in line for line in ran)


def test_sampled_runs_repeat_each_task_with_its_own_seed(smollm2_path: Path, tmp_path: Path) -> None:
    tasks = load_tasks(str(write_tasks(tmp_path, TASKS[:1])))
    options = CompareOptions(max_tokens=12, ctx=1024, temperature=0.8, repeat=3, seed=7)
    recorder = Recorder()
    report = run_compare(parse_contenders([str(smollm2_path)]), tasks, options, opener=recorder)
    (smol,) = report.contenders
    assert [(t.id, t.repeat) for t in smol.tasks] == [("capital", 0), ("capital", 1), ("capital", 2)]
    assert recorder.seeds(str(smollm2_path)) == ["7", "8", "9"] and report.complete
    assert report.to_json()["options"]["temperature"] == 0.8


TINY_PRESET = """
name = "tiny-hub"
display_name = "A tiny model on the Hub"
repo = "acme/Tiny-GGUF"
default_quant = "Q4_K_M"
chat_template = "gguf"

[quants.Q4_K_M]
pattern = "Q4_K_M"
fallback_bytes = 1_627_296

[architecture]
arch = "llama"
n_layers = 4
n_head_kv = 2
head_dim = 32
n_embd = 128
n_vocab = 824
n_ctx_train = 4_096

[context]
default = 512
max = 4_096
"""


def test_a_preset_not_downloaded_yet_is_planned_and_fetched_first(
    hub_server: HubServer, tmp_path: Path
) -> None:
    from clover_local import settings
    from clover_local.testing.models import tiny_model

    hub_server.add_file("acme/Tiny-GGUF", "Tiny-Q4_K_M.gguf", tiny_model("llama"))
    settings.user_presets_dir().mkdir(parents=True, exist_ok=True)
    (settings.user_presets_dir() / "tiny-hub.toml").write_text(TINY_PRESET, encoding="utf-8")
    tasks = load_tasks(str(write_tasks(tmp_path, TASKS[:1])))
    steps: list[Progress] = []
    report = run_compare(
        parse_contenders(["tiny-hub"]), tasks, CompareOptions(max_tokens=8, ctx=512), on_progress=steps.append
    )
    (tiny,) = report.contenders
    assert tiny.error is None and tiny.total == 1, tiny.error
    assert hub_server.bytes_served("acme/Tiny-GGUF", "Tiny-Q4_K_M.gguf") >= tiny_model("llama").stat().st_size
    assert any(s.kind == "downloading" for s in steps)


def test_a_local_contender_in_llama_server_has_its_memory_measured_in_that_process(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOVER_LLAMA_SERVER", str(llama_server_path()))
    tasks = load_tasks(str(write_tasks(tmp_path, TASKS[:2])))
    recorder = Recorder()
    options = CompareOptions(max_tokens=16, ctx=1024, engine="llama-server")
    report = run_compare(
        parse_contenders([str(smollm2_path), str(gemma_path)]), tasks, options, opener=recorder
    )
    assert recorder.most_open == 1  # a llama-server is stopped before the next one starts
    for c in report.contenders:
        assert c.error is None and c.total == 2 and c.engine.startswith("llama-server"), c.error
        assert c.peak_ram_bytes and c.peak_ram_bytes > 0
    smol = report.contenders[0]
    assert {t.id: t.passed for t in smol.tasks}["capital"]


def test_an_hf_repo_without_a_quant_gets_the_one_planned_for_this_machine(
    hub_server: HubServer, tmp_path: Path
) -> None:
    from clover_local.testing.models import tiny_model

    repo = "acme/Two-GGUF"
    small, big = tiny_model("llama", "q8_0"), tiny_model("llama")
    hub_server.add_file(repo, "Two-Q8_0.gguf", small)
    hub_server.add_file(repo, "Two-F16.gguf", big)
    tasks = load_tasks(str(write_tasks(tmp_path, TASKS[:1])))
    report = run_compare(parse_contenders([f"hf:{repo}"]), tasks, CompareOptions(max_tokens=8, ctx=512))
    (two,) = report.contenders
    assert two.error is None and two.total == 1, two.error
    from clover_local.fetch import cache

    # Both quants were weighed (their headers read), one was downloaded: the one the plan chose.
    assert hub_server.bytes_served(repo, "Two-Q8_0.gguf") and hub_server.bytes_served(repo, "Two-F16.gguf")
    blobs = list((cache.repo_folder(repo) / "blobs").iterdir())
    assert len(blobs) == 1 and blobs[0].stat().st_size in (small.stat().st_size, big.stat().st_size)
    assert ("Two-F16" in two.engine) == (blobs[0].stat().st_size == big.stat().st_size), two.engine
