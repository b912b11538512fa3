"""The one model grammar (``clover_local.model_ref``): every form a person already types, as a table, and what
each names on this machine (``model_files.named_model``)."""

from __future__ import annotations

import pytest

from clover_local.errors import ModelRefError, UsageError
from clover_local.model_files import NamedModel, named_model
from clover_local.model_ref import ModelRef, parse_model_ref

PRESETS = ("clover-35b-a3b", "gemma3-270m", "smollm2-135m")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("smollm2-135m", ModelRef("smollm2-135m", "preset", preset="smollm2-135m")),
        ("./presets/mine.toml", ModelRef("./presets/mine.toml", "preset", preset="./presets/mine.toml")),
        ("mine.toml", ModelRef("mine.toml", "preset", preset="mine.toml")),
        ("./Model-Q4_K_M.gguf", ModelRef("./Model-Q4_K_M.gguf", "file", path="./Model-Q4_K_M.gguf")),
        ("~/m/x.GGUF", ModelRef("~/m/x.GGUF", "file", path="~/m/x.GGUF")),
        ("/abs/split-00001-of-00002.gguf", ModelRef(
            "/abs/split-00001-of-00002.gguf", "file", path="/abs/split-00001-of-00002.gguf")),
        ("models/x.gguf", ModelRef("models/x.gguf", "file", path="models/x.gguf")),
        # llama.cpp's -hf ORG/REPO[:QUANT]
        ("bartowski/SmolLM2-135M-Instruct-GGUF", ModelRef(
            "bartowski/SmolLM2-135M-Instruct-GGUF", "hub", repo="bartowski/SmolLM2-135M-Instruct-GGUF")),
        ("ggml-org/gemma-3-270m-GGUF:Q8_0", ModelRef(
            "ggml-org/gemma-3-270m-GGUF:Q8_0", "hub", repo="ggml-org/gemma-3-270m-GGUF", quant="Q8_0")),
        # Ollama's hf.co/ORG/REPO[:QUANT], its :latest, and the page's URL
        ("hf.co/unsloth/Qwen3-GGUF:q4_k_m", ModelRef(
            "hf.co/unsloth/Qwen3-GGUF:q4_k_m", "hub", repo="unsloth/Qwen3-GGUF", quant="q4_k_m")),
        ("hf.co/unsloth/Qwen3-GGUF:latest", ModelRef(
            "hf.co/unsloth/Qwen3-GGUF:latest", "hub", repo="unsloth/Qwen3-GGUF")),
        ("https://huggingface.co/unsloth/Qwen3-GGUF/tree/main", ModelRef(
            "https://huggingface.co/unsloth/Qwen3-GGUF/tree/main", "hub", repo="unsloth/Qwen3-GGUF")),
        # compare's hf:ORG/REPO[:QUANT]
        ("hf:a/b:IQ3_XXS", ModelRef("hf:a/b:IQ3_XXS", "hub", repo="a/b", quant="IQ3_XXS")),
        ("  hf:a/b  ", ModelRef("  hf:a/b  ", "hub", repo="a/b")),
    ],
)  # fmt: skip
def test_every_form_reads_as_what_it_names(text: str, expected: ModelRef) -> None:
    assert parse_model_ref(text, presets=PRESETS) == expected


def test_the_llama_cpp_spec_of_a_repo() -> None:
    assert parse_model_ref("hf.co/a/b:Q4_K_M").hf_spec == "a/b:Q4_K_M"
    assert parse_model_ref("a/b").hf_spec == "a/b"
    assert parse_model_ref("x.gguf").hf_spec is None


def test_endpoints_only_where_a_command_takes_one() -> None:
    ref = parse_model_ref("http://127.0.0.1:8080#qwen3:30b-a3b", endpoints=True)
    assert (ref.kind, ref.url, ref.model) == ("endpoint", "http://127.0.0.1:8080/v1", "qwen3:30b-a3b")
    with pytest.raises(ModelRefError, match="endpoint's URL") as err:
        parse_model_ref("http://127.0.0.1:8080/v1#m")
    assert "URL#MODEL" not in (err.value.fix or "")  # the forms of this command: no endpoint among them
    with pytest.raises(ModelRefError, match="names no model"):
        parse_model_ref("http://127.0.0.1:8080/v1", endpoints=True)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "hf:not a repo", "a/b/c/d", "hf.co/only-org", "a/b:bad quant", "no such preset", "gemma4"],
)
def test_one_error_lists_the_forms(text: str) -> None:
    with pytest.raises(ModelRefError) as err:
        parse_model_ref(text, presets=PRESETS)
    assert isinstance(err.value, UsageError)  # exit code 2, no traceback
    fix = err.value.fix or ""
    for form in ("a preset", ".gguf", "ORG/REPO[:QUANT]", "hf.co/ORG/REPO[:QUANT]", "hf:ORG/REPO[:QUANT]"):
        assert form in fix


def test_an_unknown_bare_name_lists_the_presets() -> None:
    with pytest.raises(ModelRefError, match="smollm2-135m"):
        parse_model_ref("smollm", presets=PRESETS)
    assert parse_model_ref("smollm").kind == "preset"  # without the list, loading it says


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("smollm2-135m", NamedModel(preset="smollm2-135m")),
        # A preset's own repo is that preset, with the quant as the preset names it (any case, as -hf).
        ("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", NamedModel(preset="smollm2-135m")),
        ("hf.co/huggingfacetb/smollm2-135m-instruct-gguf:q4_1", NamedModel(preset="smollm2-135m", quant="Q4_1")),
        ("hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1", NamedModel(preset="smollm2-135m", quant="Q4_1")),
        # A quant the preset does not list: its repo's own files say.
        ("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q8_0", NamedModel(
            preset="smollm2-135m", repo="HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", quant="Q8_0")),
        ("bartowski/Other-GGUF:Q4_K_M", NamedModel(repo="bartowski/Other-GGUF", quant="Q4_K_M")),
    ],
)  # fmt: skip
def test_what_a_name_means_here(text: str, named: NamedModel) -> None:
    assert named_model(parse_model_ref(text, presets=PRESETS)) == named


def test_a_file_is_expanded_and_an_endpoint_is_not_run_here() -> None:
    from pathlib import Path

    assert named_model(parse_model_ref("~/x.gguf")).model == str(Path("~/x.gguf").expanduser())
    with pytest.raises(UsageError, match="compare"):
        named_model(parse_model_ref("http://h:1/v1#m", endpoints=True))
