"""Every command reads a model named in every form people already type (``clover_local.model_ref``): a preset,
a .gguf path, llama.cpp's ``ORG/REPO[:QUANT]``, Ollama's ``hf.co/ORG/REPO[:QUANT]`` and ``hf:ORG/REPO[:QUANT]``,
as ``MODEL`` or ``--model``. The demo model (SmolLM2, packaged) is named by its preset and by its own Hub repo; a
copy of it on the Hub stand-in (``tests/hub_server.py``) is a repo no preset knows, downloaded first. And
``serve`` answers to the preset's name."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from hub_server import HubServer
from waiting import wait_until

from clover_local.cli import build_parser, main
from clover_local.compare.contenders import parse_contender
from clover_local.errors import UsageError
from clover_local.llamacpp.server import free_port

DEMO_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"  # smollm2-135m's own repo
DEMO_FORMS = [
    "smollm2-135m",
    f"{DEMO_REPO}:Q4_1",
    f"hf.co/{DEMO_REPO.lower()}:q4_1",
    f"hf:{DEMO_REPO}",
    "FILE",  # the packaged .gguf's path
]
COPY = "community/SmolLM2-Copy-GGUF"  # no preset's repo: planned and run from its own files
COPY_FILE = "SmolLM2-Copy-Q4_1.gguf"
COPY_FORMS = [f"{COPY}:Q4_1", f"hf.co/{COPY}:Q4_1", f"hf:{COPY}:Q4_1", f"https://huggingface.co/{COPY}"]


def _named(form: str, smollm2_path: Path) -> str:
    return str(smollm2_path) if form == "FILE" else form


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.fixture
def copy_on_hub(hub_server: HubServer, smollm2_path: Path) -> HubServer:
    hub_server.add_file(COPY, COPY_FILE, smollm2_path)
    hub_server.add_file(COPY, "README.md", "a copy of SmolLM2 135M Instruct")
    return hub_server


@pytest.fixture
def copy_downloaded(copy_on_hub: HubServer, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["download", f"{COPY}:Q4_1", "--json"]) == 0
    path = Path(json.loads(capsys.readouterr().out)["path"])
    assert path.name == COPY_FILE
    return path


# -- plan --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [(), ("--model",)])
@pytest.mark.parametrize("form", DEMO_FORMS)
def test_plan_reads_every_form(
    form: str, flag: tuple[str, ...], smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *flag, _named(form, smollm2_path), "--offline", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["preset"], plan["quant"], plan["model_path"]) == ("smollm2-135m", "Q4_1", str(smollm2_path))


@pytest.mark.parametrize("form", COPY_FORMS)
def test_plan_reads_a_repo_no_preset_knows_from_its_files(
    form: str, copy_on_hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", form, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["quant"] == "Q4_1"  # the quant its one file names (the -hf pick when none is asked)
    assert "header" in json.dumps(plan["size_sources"])  # exact sizes, read from the file on the Hub


def test_the_model_named_twice_or_contradicted_is_said(
    smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["smollm2-135m", "--model", str(smollm2_path)], "named twice"),
        (["smollm2-135m", "--preset", "gemma3-270m"], "--preset says gemma3-270m"),
        ([f"{DEMO_REPO}:Q4_1", "--quant", "Q8_0"], "--quant says Q8_0"),
    ]
    for argv, said in cases:
        assert main(["plan", *argv, "--offline"]) == 2
        assert said in capsys.readouterr().err


def test_a_name_in_no_form_lists_the_forms(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "smollm3", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "not a preset here" in err and "hf.co/ORG/REPO[:QUANT]" in err and "Traceback" not in err


# -- download ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", COPY_FORMS)
def test_download_reads_every_form_of_a_repo(
    form: str, copy_on_hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["download", form, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["repo"] == COPY and Path(result["path"]).name == COPY_FILE
    assert Path(result["path"]).is_file()


@pytest.mark.parametrize("form", DEMO_FORMS)
def test_download_of_the_demo_model_needs_no_network(
    form: str, smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["download", _named(form, smollm2_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(smollm2_path)


# -- chat and serve: the file they load ---------------------------------------------------------------------


@pytest.mark.parametrize("flag", [(), ("--model",)])
@pytest.mark.parametrize("form", DEMO_FORMS)
def test_chat_and_serve_load_the_file_every_form_names(
    form: str, flag: tuple[str, ...], smollm2_path: Path
) -> None:
    from clover_local.commands.chat import start_options
    from clover_local.commands.serve import model_file

    named = _named(form, smollm2_path)
    assert start_options(_args("chat", *flag, named)).model_path == str(smollm2_path)
    assert model_file(_args("serve", *flag, named)) == smollm2_path


@pytest.mark.parametrize("form", COPY_FORMS)
def test_chat_and_serve_load_a_downloaded_repo_offline(
    form: str, copy_downloaded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clover_local.commands.chat import start_options
    from clover_local.commands.serve import model_file

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing is asked of the Hub
    assert start_options(_args("chat", form)).model_path == str(copy_downloaded)
    assert model_file(_args("serve", form)) == copy_downloaded


def test_a_repo_not_downloaded_says_how_to_get_it() -> None:
    from clover_local.commands.serve import model_file

    with pytest.raises(UsageError, match="not downloaded yet") as err:
        model_file(_args("serve", "hf.co/nobody/Nothing-GGUF:Q4_K_M"))
    assert "clover-local download nobody/Nothing-GGUF:Q4_K_M" in (err.value.fix or "")


# -- compare -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "kind", "target"),
    [
        ("smollm2-135m", "preset", "smollm2-135m"),
        ("./m.gguf", "gguf", "./m.gguf"),
        (f"{COPY}:Q4_1", "hf", COPY),
        (f"hf.co/{COPY}:Q4_1", "hf", COPY),
        (f"hf:{COPY}:Q4_1", "hf", COPY),
        ("http://127.0.0.1:8080#m", "endpoint", "http://127.0.0.1:8080/v1"),
    ],
)
def test_compare_reads_every_form(form: str, kind: str, target: str) -> None:
    contender = parse_contender(form)
    assert (contender.kind, contender.target) == (kind, target)
    assert contender.name == form


# -- run: a reply from each form -------------------------------------------------------------------------


def _reply(form: str, capsys: pytest.CaptureFixture[str]) -> str:
    argv = ["run", form, "--prompt", "Say hi.", "--max-tokens", "3", "--temperature", "0", "--json"]
    assert main(argv) == 0
    return str(json.loads(capsys.readouterr().out)["text"])


@pytest.mark.slow
def test_run_reads_every_form(
    smollm2_path: Path, copy_downloaded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replies = {form: _reply(_named(form, smollm2_path), capsys) for form in DEMO_FORMS}
    replies |= {form: _reply(form, capsys) for form in COPY_FORMS[:2]}
    assert all(replies.values()) and len(set(replies.values())) == 1  # one model, greedy: one reply


# -- serve answers to the preset's name --------------------------------------------------------------------


def _serve(argv: list[str]) -> Iterator[str]:
    """``clover-local serve ARGV`` on the embedded engine, as a person runs it; its /v1 base URL."""
    port = free_port()
    options = ["--engine", "embedded", "--ctx", "512", "--parallel", "1", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "clover_local", "serve", *argv, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ),
    )
    base = f"http://127.0.0.1:{port}/v1"

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"serve exited with {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=2).models.list()
            return True
        except openai.APIConnectionError:
            return False

    wait_until(ready, what="clover-local serve to answer")
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture
def served_under_a_preset(smollm2_path: Path) -> Iterator[str]:
    """``serve --preset smol-chat`` where the user preset ``smol-chat`` describes its file's architecture
    otherwise, so the plan is made for the file as itself, under the file's name: the case where a request
    for the preset's own name was refused."""
    from clover_local import settings

    text = (Path(__file__).parents[1] / "presets" / "smollm2-135m.toml").read_text()
    text = text.replace('name = "smollm2-135m"', 'name = "smol-chat"').replace(
        "n_layers = 30", "n_layers = 31"
    )
    settings.user_presets_dir().mkdir(parents=True, exist_ok=True)
    (settings.user_presets_dir() / "smol-chat.toml").write_text(text)
    yield from _serve(["--preset", "smol-chat", "--model", str(smollm2_path)])


@pytest.mark.slow
def test_serve_answers_to_the_preset_name_and_every_name_it_lists(served_under_a_preset: str) -> None:
    client = openai.OpenAI(base_url=served_under_a_preset, api_key="none", max_retries=0, timeout=120)
    listed = [m.id for m in client.models.list().data]
    assert listed[0] == "smol-chat"  # the name asked for comes first
    assert {"SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"} <= set(listed)
    for name in [*listed, "SMOL-CHAT"]:
        reply = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
        )
        assert reply.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="smol-chat"):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "Hi"}])


# -- the app's model picker --------------------------------------------------------------------------------


async def test_the_model_picker_opens_a_name_typed_in_any_form(smollm2_path: Path) -> None:
    from textual.app import App
    from textual.widgets import Input, Static
    from waiting import wait_until as wait

    from clover_local.tui.app import CloverApp
    from clover_local.tui.screens.models import ModelPicker
    from clover_local.tui.services import ModelChoice

    class Host(App[None]):
        CSS_PATH = CloverApp.CSS_PATH

        def __init__(self) -> None:
            super().__init__()
            self.picked: list[ModelChoice | None] = []

        def on_mount(self) -> None:
            self.push_screen(ModelPicker(), self.picked.append)

    typed = {
        f"hf.co/{DEMO_REPO}:Q4_1": ModelChoice(path=str(smollm2_path)),  # a preset's repo and quant: its file
        DEMO_REPO: ModelChoice(preset="smollm2-135m"),
        "smollm2-135m": ModelChoice(preset="smollm2-135m"),
        str(smollm2_path): ModelChoice(path=str(smollm2_path)),
    }
    for text, expected in typed.items():
        app = Host()
        async with app.run_test(size=(100, 30)) as pilot:
            picker = app.screen
            assert isinstance(picker, ModelPicker)
            await wait(lambda p=picker: p.ready, "the models on disk", pilot=pilot)
            box = picker.query_one("#models-path", Input)
            box.value = text
            box.focus()
            await pilot.press("enter")
            await wait(lambda a=app: bool(a.picked), f"the picker to open {text}", pilot=pilot)
        assert app.picked == [expected], text
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        picker = app.screen
        assert isinstance(picker, ModelPicker)
        await wait(lambda p=picker: p.ready, "the models on disk", pilot=pilot)
        box = picker.query_one("#models-path", Input)
        box.value = "no such model"
        box.focus()
        await pilot.press("enter")
        note = picker.query_one("#models-note", Static)
        await wait(lambda: "hf.co/ORG/REPO[:QUANT]" in str(note.render()), "the forms, said", pilot=pilot)
        assert not app.picked and app.screen is picker  # still open, to type again


@pytest.mark.slow
def test_serve_answers_to_the_preset_of_a_repo_and_to_the_repo_as_typed() -> None:
    typed = f"hf.co/{DEMO_REPO}:Q4_1"
    for base in _serve([typed]):
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
        listed = [m.id for m in client.models.list().data]
        assert listed[0] == "smollm2-135m" and typed in listed
        for name in ("smollm2-135m", typed, "SmolLM2-135M-Instruct.Q4_1"):
            reply = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
            )
            assert reply.choices[0].message.content is not None


async def test_the_model_picker_leaves_out_the_test_model(gemma_path: Path) -> None:
    """Issue 49: Gemma 3 270M, a base model kept for the tests (``for_tests``), was offered as a chat model;
    typed by name it still opens."""
    from textual.app import App
    from textual.widgets import Input, OptionList
    from waiting import wait_until as wait

    from clover_local.tui.app import CloverApp
    from clover_local.tui.screens.models import ModelPicker
    from clover_local.tui.services import ModelChoice

    class Host(App[None]):
        CSS_PATH = CloverApp.CSS_PATH

        def __init__(self) -> None:
            super().__init__()
            self.picked: list[ModelChoice | None] = []

        def on_mount(self) -> None:
            self.push_screen(ModelPicker(), self.picked.append)

    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        picker = app.screen
        assert isinstance(picker, ModelPicker)
        await wait(lambda: picker.ready, "the models on disk", pilot=pilot)
        listed = picker.query_one("#models-list", OptionList)
        shown = [str(listed.get_option_at_index(i).prompt) for i in range(listed.option_count)]
        assert any("smollm2-135m" in line for line in shown), shown
        assert not any("Gemma 3 270M" in line or "gemma3-270m" in line for line in shown), shown
        assert ModelChoice(preset="gemma3-270m") not in picker.choices.values()
        assert all(c.path != str(gemma_path) for c in picker.choices.values())
        box = picker.query_one("#models-path", Input)
        box.value = "gemma3-270m"
        box.focus()
        await pilot.press("enter")
        await wait(lambda: bool(app.picked), "the typed test model", pilot=pilot)
    assert app.picked == [ModelChoice(preset="gemma3-270m")]
