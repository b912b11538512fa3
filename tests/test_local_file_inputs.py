"""A local GGUF is judged by its own header: a truncated file is refused by name, a file that is not the
preset's model is planned as itself (its name, its trained context), and ``--ctx`` is checked against that
context before anything is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clover_local.cli import main
from clover_local.gguf.header import read_local_header
from clover_local.testing.models import gemma_path, tiny_model

GEMMA_TRAINED_CTX = 32768


def test_plan_on_a_truncated_gguf_says_it_is_truncated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = tiny_model("llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-1000])
    assert main(["plan", "--model", str(cut), "--simulate", "ram=16G"]) == 1
    err = capsys.readouterr().err
    assert str(cut) in err and "truncated" in err and "1,000 missing" in err and "Traceback" not in err


def test_a_whole_file_passes_the_size_check() -> None:
    assert read_local_header(tiny_model("llama")).exact


def test_plan_describes_a_local_file_by_its_own_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file whose name says no preset is planned as itself; one whose name does, as that preset (the same
    choice ``run``, ``serve`` and the app make: ``runtime.preset_for_file``)."""
    gemma = tmp_path / "my-model.gguf"
    shutil.copyfile(gemma_path(), gemma)
    assert read_local_header(gemma).architecture.n_ctx_train == GEMMA_TRAINED_CTX
    assert main(["plan", "--model", str(gemma), "--simulate", "ram=16G", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["preset"] == "my-model" and plan["ctx"] <= GEMMA_TRAINED_CTX
    assert main(["plan", "--model", str(gemma), "--simulate", "ram=16G"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "Clover" not in first and "Gemma" in first, first
    assert main(["plan", "--model", str(gemma_path()), "--simulate", "ram=16G", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["preset"] == "gemma3-270m"


@pytest.mark.parametrize("command", ["plan", "run", "chat"])
@pytest.mark.parametrize("ctx", ["99999999", "0", str(GEMMA_TRAINED_CTX + 1)])
def test_ctx_is_checked_against_the_files_trained_context(
    command: str, ctx: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = {"plan": ["--simulate", "ram=16G"], "run": ["--prompt", "hi", "--max-tokens", "1"], "chat": []}[
        command
    ]
    assert main([command, "--model", str(gemma_path()), "--ctx", ctx, *extra]) == 2
    err = capsys.readouterr().err
    assert f"A context of {ctx} tokens" in err and str(GEMMA_TRAINED_CTX) in err and "Traceback" not in err


def test_the_presets_own_file_keeps_the_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(gemma_path(), copy)
    assert (
        main(["plan", "--preset", "gemma3-270m", "--model", str(copy), "--simulate", "ram=16G", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["preset"] == "gemma3-270m"
