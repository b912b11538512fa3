"""Plans from exact tensor sizes before anything is downloaded: each quant's GGUF header read from the (fake)
Hub with range requests, a downloaded file preferred, headers reused offline, the preset's estimate with a
note when nothing better can be had; and ``plan --compare-fit`` next to the real ``llama-fit-params``.

The model is the tiny random Clover-architecture GGUF (``qwen35moe``) in two quants, F16 and Q8_0, under a
user preset whose estimated sizes are deliberately wrong (F16 "smaller" than Q8_0), so a plan that really
used the headers picks differently from one that used the estimates.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers_serve import llama_server_path
from hub_server import HubServer

from clover_local import settings
from clover_local.cli import main
from clover_local.fetch import remote_header
from clover_local.fetch.describe import describe_quants
from clover_local.gguf.header import read_local_header
from clover_local.presets import Preset, load_preset
from clover_local.testing.presets import tiny_qwen35moe_preset

REPO = "acme/Tiny-Clover-GGUF"
FILES = {"F16": "Tiny-Clover-F16.gguf", "Q8_0": "Tiny-Clover-Q8_0.gguf"}
HEADER_READ = 32 * 1024
"""First range read for these tests: the tiny model's header (28.8 KB) fits, its 2.9-5.4 MB of weights not."""

PRESET = tiny_qwen35moe_preset(
    "tiny-clover",
    "acme/Tiny-Clover-GGUF",
    # both wrong on purpose: the real files are 5.4 MB and 2.9 MB
    {"F16": 1_000_000, "Q8_0": 90_000_000},
    extra_architecture="expert_weight_fraction = 0.59\n",
)


@dataclass(frozen=True)
class TinyClover:
    preset: Preset
    files: dict[str, Path]
    """Quant -> the local file served as ``FILES[quant]``."""


@pytest.fixture
def tiny_clover(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch) -> TinyClover:
    """The user preset ``tiny-clover`` and its repo on the fake Hub (two quants and a README)."""
    from clover_local.testing.models import tiny_model

    presets = settings.user_presets_dir()
    presets.mkdir(parents=True, exist_ok=True)
    (presets / "tiny-clover.toml").write_text(PRESET)
    files = {"F16": tiny_model("qwen35moe", "f16"), "Q8_0": tiny_model("qwen35moe", "q8_0")}
    for quant, path in files.items():
        hub_server.add_file(REPO, FILES[quant], path)
    hub_server.add_file(REPO, "README.md", "# Tiny Clover\n")
    monkeypatch.setattr(remote_header, "FIRST_READ_REMOTE", HEADER_READ)
    return TinyClover(load_preset("tiny-clover"), files)


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", "--preset", "tiny-clover", "--simulate", "ram=16G", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def file_requests(hub: HubServer) -> list[str]:
    return [r.path for r in hub.requests if "/resolve/" in r.path]


def test_plan_uses_exact_sizes_read_from_the_hub_before_download(
    hub_server: HubServer, tiny_clover: TinyClover, capsys: pytest.CaptureFixture[str]
) -> None:
    estimated = plan_json(capsys, "--goal", "speed", "--offline")
    assert estimated["estimated"] is True and estimated["quant"] == "F16"  # the preset says F16 is smaller
    assert hub_server.requests == []

    exact = plan_json(capsys, "--goal", "speed")
    assert exact["estimated"] is False
    assert exact["quant"] == "Q8_0"  # the headers say Q8_0 is the smaller file
    assert exact["file_bytes"] == tiny_clover.files["Q8_0"].stat().st_size
    assert exact["size_sources"] == {
        q: f"exact, from the GGUF header of {FILES[q]} on the Hub" for q in FILES
    }
    assert f"Sizes of Q8_0: exact, from the GGUF header of {FILES['Q8_0']} on the Hub." in exact["reasons"]
    assert exact["model_path"] is None and "-m" not in exact["llama_server_args"]
    # Only the headers crossed the network, each in range requests.
    for quant, path in tiny_clover.files.items():
        assert hub_server.bytes_served(REPO, FILES[quant]) == HEADER_READ < path.stat().st_size / 50
    gets = [r for r in hub_server.requests if r.method == "GET" and "/resolve/" in r.path]
    assert gets and all(r.range == f"bytes=0-{HEADER_READ - 1}" for r in gets)
    assert not any(settings.hf_cache_dir().rglob("*.gguf"))  # nothing downloaded

    described = describe_quants(tiny_clover.preset)
    for quant, path in tiny_clover.files.items():
        local = read_local_header(path)
        assert described.models[quant].tensors == local.tensors
        assert described.models[quant].architecture == local.architecture

    text_code = main(["plan", "--preset", "tiny-clover", "--simulate", "ram=16G", "--why"])
    text = capsys.readouterr().out
    assert (
        text_code == 0 and f"Sizes of F16: exact, from the GGUF header of {FILES['F16']} on the Hub." in text
    )
    assert "Sizes are estimates" not in text


def test_offline_reuses_headers_read_before_without_a_request(
    hub_server: HubServer,
    tiny_clover: TinyClover,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from huggingface_hub import constants

    first = describe_quants(tiny_clover.preset)
    assert first.exact
    hub_server.reset_counters()

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    again = describe_quants(tiny_clover.preset)
    assert again.exact and again.models == first.models
    assert all("read earlier and cached" in again.sources[q] for q in FILES)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    data = plan_json(capsys, "--offline")
    assert data["estimated"] is False
    assert hub_server.requests == []  # neither HF_HUB_OFFLINE nor --offline asked the Hub anything


def test_offline_without_cached_headers_estimates_and_says_why(
    hub_server: HubServer, tiny_clover: TinyClover
) -> None:
    described = describe_quants(tiny_clover.preset, offline=True)
    assert not any(d.exact for d in described.models.values())
    assert described.models["Q8_0"].file_bytes == 90_000_000
    assert described.notes == (
        "F16: estimated from the preset: offline (HF_HUB_OFFLINE=1 or --offline), and its header was never read "
        "here",
        "Q8_0: estimated from the preset: offline (HF_HUB_OFFLINE=1 or --offline), and its header was never read "
        "here",
    )
    assert hub_server.requests == []


def test_hub_down_estimates_and_says_why(hub_server: HubServer, tiny_clover: TinyClover) -> None:
    hub_server.stop()
    described = describe_quants(tiny_clover.preset)
    assert not described.exact
    for quant in FILES:
        assert described.sources[quant].startswith("estimated from the preset")
        assert "could not reach the Hub" in described.sources[quant]


class SilentServer:
    """Accepts connections and never answers: a Hub behind a dead network path."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent_hub(tiny_clover: TinyClover, monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentServer]:
    """The tiny Clover preset, with huggingface_hub pointed at a :class:`SilentServer` instead of the fake Hub."""
    from huggingface_hub import constants

    server = SilentServer()
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    yield server
    server.close()


def test_a_hub_that_never_answers_costs_one_timeout(
    silent_hub: SilentServer, tiny_clover: TinyClover
) -> None:
    """Without the timeout this test would hang; with it, the first quant gives up and the second asks nothing."""
    described = describe_quants(tiny_clover.preset, timeout_s=0.5)
    assert not described.exact
    assert all("could not reach the Hub" in described.sources[q] for q in FILES)
    assert "Timeout" in described.sources["F16"]
    assert len(silent_hub.accepted) == 1


def test_a_downloaded_file_is_preferred_to_the_remote_header(
    hub_server: HubServer, tiny_clover: TinyClover, capsys: pytest.CaptureFixture[str]
) -> None:
    from clover_local.fetch.download import download_model

    path = download_model(tiny_clover.preset, "F16")
    hub_server.reset_counters()

    described = describe_quants(tiny_clover.preset)
    assert described.sources["F16"] == f"exact, from the downloaded file {FILES['F16']}"
    assert described.paths == {"F16": path}
    assert described.models["F16"] == read_local_header(path)
    assert described.sources["Q8_0"] == f"exact, from the GGUF header of {FILES['Q8_0']} on the Hub"
    assert not any(FILES["F16"] in p for p in file_requests(hub_server))

    data = plan_json(capsys, "--quant", "F16")
    assert data["model_path"] == str(path) and data["llama_server_args"][:2] == ["-m", str(path)]
    assert main(["command", "--preset", "tiny-clover", "--simulate", "ram=16G", "--quant", "F16"]) == 0
    assert f" -m {path} " in capsys.readouterr().out


def test_download_auto_weighs_quants_with_exact_sizes(
    hub_server: HubServer, tiny_clover: TinyClover, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the preset's estimates the planner would take Q8_0 (it looks larger); the headers say F16 is."""
    assert main(["download", "--preset", "tiny-clover", "--quant", "auto"]) == 0
    out, err = capsys.readouterr()
    assert "Quant F16: the planner's choice" in err
    assert f"sizes of F16: exact, from the GGUF header of {FILES['F16']} on the Hub" in err
    downloaded = Path(out.strip().splitlines()[-1])
    assert (
        downloaded.name == FILES["F16"] and downloaded.read_bytes() == tiny_clover.files["F16"].read_bytes()
    )


# -- plan --compare-fit -------------------------------------------------------------------------------------


def test_compare_fit_shows_llama_fit_params_next_to_the_plan(
    gemma_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOVER_LLAMA_SERVER", str(llama_server_path()))
    args = ["plan", "--preset", "gemma3-270m", "--model", str(gemma_path), "--ctx", "2048", "--compare-fit"]
    assert main([*args, "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["compare_fit"]
    assert fit["shown"] is True, fit
    assert Path(fit["binary"]).name == "llama-fit-params"
    assert fit["rows"][0] == ["context", "2048", "2048"]
    assert fit["raw"].startswith("-c 2048 ")
    assert fit["differences"] == []  # a CPU machine: both keep everything in RAM

    assert main(args) == 0
    text = capsys.readouterr().out
    assert "Plan vs llama.cpp's own fit (llama-fit-params):" in text
    assert "  llama-fit-params said: -c 2048" in text and "The plan and llama.cpp's own fit agree." in text


def test_compare_fit_says_why_it_cannot_be_shown(
    hub_server: HubServer,
    tiny_clover: TinyClover,
    gemma_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    assert plan_json(capsys, "--compare-fit")["compare_fit"] == {
        "shown": False,
        "why": "--simulate describes another machine, while llama-fit-params fits the devices of this one.",
    }

    assert main(["plan", "--preset", "tiny-clover", "--compare-fit", "--json"]) == 0
    why = json.loads(capsys.readouterr().out)["compare_fit"]["why"]
    assert "is not on this machine" in why and "clover-local download --preset tiny-clover" in why

    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server or llama-fit-params anywhere
    assert main(["plan", "--preset", "gemma3-270m", "--model", str(gemma_path), "--compare-fit"]) == 0
    assert "not shown: no llama-fit-params binary" in capsys.readouterr().out
