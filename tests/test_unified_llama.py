"""llama.cpp's single ``llama`` command (its installer, winget, Homebrew): ``llama serve`` is llama-server. When no
``llama-server`` is found, a ``llama`` on PATH whose ``serve --help`` is llama-server's is run as ``llama serve``:
asked for its flags that way, and shown and started that way. Another program called ``llama`` is not taken.
The stand-in ``llama`` answers with a newer llama-server's help (``tests/upstream_help.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from upstream_help import help_from_readme

from clover_local.detect import parse_simulate
from clover_local.launch import LaunchRequest, decide_launch
from clover_local.llamacpp.binary import capabilities, find_llama_server


def _on_path(folder: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder.mkdir()
    llama = folder / "llama"
    llama.write_text(script)
    llama.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    return llama


@pytest.fixture
def llama_cpp_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    help_file = tmp_path / "help.txt"
    help_file.write_text(help_from_readme())
    script = f"""#!/bin/sh
if [ "$1" != serve ]; then echo "usage: llama <serve|cli|bench> ..."; exit 1; fi
case "$2" in
  --version) echo "version: 11459 (0a1b2c3)"; echo "built with cc for x86_64-linux-gnu" ;;
  --help) exec /bin/cat {help_file} ;;
  --list-devices) echo "Available devices:" ;;
esac
"""
    return _on_path(tmp_path / "bin", script, monkeypatch)


def test_llama_serve_is_found_and_asked_as_llama_serve(llama_cpp_llama: Path) -> None:
    binary = find_llama_server()
    assert binary is not None
    assert binary.command == [str(llama_cpp_llama.resolve()), "serve"] and "llama serve" in binary.source
    caps = capabilities(binary.path, binary.subcommand)
    assert caps.build_number == 11459 and caps.supports("--spec-type") and not caps.supports("--draft-max")


def test_the_launch_runs_llama_serve_with_the_plans_flags(llama_cpp_llama: Path) -> None:
    request = LaunchRequest("smollm2-135m", engine="llama-server", offline=True)
    launch = decide_launch(request, machine=parse_simulate("ram=8G,cpu=4"))
    assert launch.runner.binary is not None and launch.runner.binary.subcommand == ("serve",)
    assert launch.command.startswith(f"{llama_cpp_llama.resolve()} serve -m ")
    assert launch.server_argv is not None  # fitted to what `llama serve --help` lists: every flag taken
    assert not [n for n in launch.notices if n.code == "flag-dropped"]
    assert any(f"{llama_cpp_llama.resolve()} serve" in n.text for n in launch.notices)  # said as it runs


def test_another_program_called_llama_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(
        tmp_path / "bin",
        "#!/bin/sh\necho 'Usage: llama [OPTIONS] COMMAND [ARGS]... (llama-stack)'\n",
        monkeypatch,
    )
    assert find_llama_server() is None
