"""``clover_local.model_files`` and the launch: which model file a person means, the plan and the engine decided for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_local import model_files, user_prefs
from clover_local.detect import parse_simulate
from clover_local.errors import UsageError
from clover_local.launch import LaunchRequest, chat_template, choose_runner, decide_launch, open_launch
from clover_local.plan.llama_args import llama_server_args
from clover_local.presets import load_preset


@pytest.mark.parametrize(
    ("file_name", "preset"),
    [
        ("gemma-3-270m-Q4_K_M.gguf", "gemma3-270m"),  # the Hub repo's name, ggml-org/gemma-3-270m-GGUF
        ("gemma3-270m.gguf", "gemma3-270m"),  # the preset's name (the packaged test model's file)
        ("Clover-35B-A3B-Preview-Q8_0-00001-of-00002.gguf", "clover-35b-a3b"),
        ("something-else.gguf", "clover-35b-a3b"),  # unknown: the default preset
    ],
)
def test_a_file_without_a_preset_gets_the_preset_its_name_says(file_name: str, preset: str) -> None:
    assert model_files.preset_for_file(Path("/models") / file_name).name == preset


def test_a_given_model_must_be_a_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="No GGUF file at"):
        model_files.find_model(None, tmp_path / "missing.gguf")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    with pytest.raises(UsageError, match=r"is not a \.gguf file"):
        model_files.find_model(None, notes)


def test_a_missing_download_says_how_to_get_it() -> None:
    clover = load_preset("clover-35b-a3b")
    assert model_files.find_model(clover) is None
    with pytest.raises(UsageError) as raised:
        model_files.require_model(clover)
    assert "clover-local download --preset clover-35b-a3b" in (raised.value.fix or "")


def test_the_file_the_first_run_chose_is_found(tmp_path: Path) -> None:
    chosen = tmp_path / "my-clover-Q4_K_M.gguf"
    chosen.write_bytes(b"GGUF")
    first = user_prefs.FirstRun(preset="clover-35b-a3b", quant="Q4_K_M", ctx=4096, model_path=str(chosen))
    user_prefs.save_prefs(user_prefs.Prefs().with_first_run(first))
    assert model_files.find_model(load_preset("clover-35b-a3b")) == chosen
    assert model_files.find_model(load_preset("clover-35b-a3b"), quant="Q8_0") is None, (
        "another quant: not that file"
    )


def test_a_packaged_preset_needs_no_download(gemma_path: Path) -> None:
    found = model_files.find_model(load_preset("gemma3-270m"))
    assert found is not None and found.read_bytes() == gemma_path.read_bytes()


def test_the_plan_for_a_local_file_carries_it_into_the_argv(gemma_path: Path) -> None:
    launch = decide_launch(
        LaunchRequest("gemma3-270m", str(gemma_path), ctx=1024), machine=parse_simulate("ram=16G,cpu=4")
    )
    plan, preset = launch.plan, launch.preset
    assert preset.name == "gemma3-270m" and not plan.estimated
    assert plan.model_path == str(gemma_path.resolve())
    argv = llama_server_args(plan)
    assert argv[:2] == ["-m", str(gemma_path.resolve())]
    assert any(r.text.startswith("Sizes of Q4_K_M: exact, from the local file") for r in plan.reasons)


def test_opening_a_plan_without_a_file_says_to_download_first() -> None:
    request = LaunchRequest(
        "smollm2-135m", describe=False
    )  # one the embedded engine runs: nothing to install
    launch = decide_launch(request, machine=parse_simulate("ram=64G,cpu=8"))
    assert launch.plan.model_path is None and launch.runner.install is None
    with pytest.raises(UsageError, match="No local model file"):
        open_launch(launch)


def test_an_unknown_engine_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--engine"):
        choose_runner(LaunchRequest(engine="vllm"), None)  # type: ignore[arg-type]
    assert choose_runner(LaunchRequest(engine="embedded"), None).kind == "embedded"


def test_a_bare_model_file_is_planned_as_its_preset_with_that_template(gemma_path: Path) -> None:
    """``serve --model gemma-3-270m-Q4_K_M.gguf`` (no --preset): Gemma's preset, so llama.cpp's ``gemma``
    template on both engines, not the default preset's "the GGUF's own" (Gemma's GGUF has none, and
    llama-server then falls back to ChatML, whose ``<|im_end|>`` Gemma's vocabulary cannot end a turn with)."""
    launch = decide_launch(
        LaunchRequest(None, str(gemma_path), ctx=1024), machine=parse_simulate("ram=16G,cpu=4")
    )
    plan, preset = launch.plan, launch.preset
    assert preset.name == "gemma3-270m" and plan.chat_template == "gemma"
    argv = llama_server_args(plan)
    at = argv.index("--chat-template")
    assert argv[at : at + 3] == ["--chat-template", "gemma", "--no-jinja"]
    template = chat_template(launch)
    assert (template.kind, template.name) == ("builtin", "gemma")


def test_a_gguf_without_a_template_and_preset_is_chatted_with_as_plain_text(tmp_path: Path) -> None:
    """Neither engine invents a template: both send plain completion text, and say so."""
    from clover_local.testing.models import TinySpec, tiny_model_from_spec

    path = tiny_model_from_spec(TinySpec(kind="llama", chat_template=""))
    launch = decide_launch(LaunchRequest(None, str(path), ctx=512), machine=parse_simulate("ram=16G,cpu=4"))
    template = chat_template(launch)
    assert template.kind == "completion" and template.notice
