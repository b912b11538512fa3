"""An architecture the llama.cpp here cannot load is refused before its bytes: against the fake Hub (counting what
it serves), on ``plan`` (``--json`` carries the answer), ``download``, ``run``, ``chat`` and ``serve`` with a local
file, for drafter sidecars, and on the app's plan screen before its Download button.

The unknown model is a real tiny GGUF (the random qwen35moe, the Gated DeltaNet family) whose header says
``clover-bd`` instead: what a new architecture's release would look like to this llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_fetch import ARCH_READ
from hub_server import HubServer
from waiting import wait_until

from clover_local import llama_arch_table, settings
from clover_local.cli import main
from clover_local.fetch import cache
from clover_local.fetch.remote_header import FIRST_READ_REMOTE
from clover_local.gguf.parse import parse_header
from clover_local.testing.models import tiny_model, tiny_mtp_model, with_architecture

UNKNOWN = "clover-bd"
REPO = "acme/Clover-Next-GGUF"
MODEL = "Clover-Next-Q4_K_M.gguf"
SIDECAR = "mtp-Clover-Next-Q4_K_M.gguf"
VERSIONS = (
    f"llama-cpp-python {llama_arch_table.LLAMA_CPP_PYTHON}",
    f"llama.cpp {llama_arch_table.LLAMA_CPP_COMMIT}",
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny qwen35moe with its MTP sidecar, each as itself and renamed to the unknown architecture."""
    trunk, head = tiny_mtp_model("sidecar")
    assert head is not None
    out = tmp_path_factory.mktemp("arch")
    return {
        "known": trunk,
        "known-mtp": head,
        "unknown": with_architecture(trunk, UNKNOWN, out / "unknown" / MODEL),
        "unknown-mtp": with_architecture(head, UNKNOWN, out / "unknown" / SIDECAR),
        "unknown-q8": with_architecture(
            tiny_model("qwen35moe"), UNKNOWN, out / "q8" / "Clover-Next-Q8_0.gguf"
        ),
    }


@pytest.fixture
def unknown_repo(hub_server: HubServer, files: dict[str, Path]) -> HubServer:
    """Laid out like a GGUF release: two quants and an ``mtp-`` sidecar, all of the unknown architecture."""
    hub_server.add_file(REPO, MODEL, files["unknown"])
    hub_server.add_file(REPO, "Clover-Next-Q8_0.gguf", files["unknown-q8"])
    hub_server.add_file(REPO, SIDECAR, files["unknown-mtp"])
    return hub_server


def _header_bytes(path: Path) -> int:
    return parse_header(path.read_bytes()).header_bytes


def _assert_the_refusal(err: str, subject: str, done: str = "downloaded") -> None:
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert line.startswith(f"error: {subject}: ") and f"'{UNKNOWN}'" in line
    assert all(v in line for v in VERSIONS) and f"Nothing was {done}." in line
    assert "pip install" not in err and "clover-local runtime install" in err and "--force" in err


def _blobs(repo: str) -> list[str]:
    folder = cache.repo_folder(repo) / "blobs"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_download_refuses_an_unknown_architecture_after_at_most_its_header(
    unknown_repo: HubServer, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["download", "--repo", REPO, "--quant", "Q4_K_M"]) == 2
    _assert_the_refusal(capsys.readouterr().err, f"{REPO} Q4_K_M")
    served = unknown_repo.bytes_served(REPO, MODEL)
    assert 0 < served == ARCH_READ <= _header_bytes(files["unknown"]) < files["unknown"].stat().st_size
    assert unknown_repo.bytes_served(REPO, SIDECAR) == 0
    assert _blobs(REPO) == []  # nothing was written to the cache

    # Asking again costs nothing: the answer is cached for the file's ETag.
    assert main(["download", "--repo", REPO, "--quant", "Q4_K_M"]) == 2
    assert unknown_repo.bytes_served(REPO, MODEL) == served


def test_force_downloads_it_anyway(
    unknown_repo: HubServer, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["download", "--repo", REPO, "--quant", "Q4_K_M", "--force", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert Path(result["path"]).read_bytes() == files["unknown"].read_bytes()
    assert result["architecture"]["name"] == UNKNOWN and result["architecture"]["supported"] is False
    assert Path(result["sidecars"]["mtp"]).read_bytes() == files["unknown-mtp"].read_bytes()
    assert "note: --force: downloading" in err


def test_a_known_architecture_downloads_as_before(
    hub_server: HubServer, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    repo = "acme/Clover-Tiny-GGUF"
    hub_server.add_file(repo, "Clover-Tiny-Q4_K_M.gguf", files["known"])
    hub_server.add_file(repo, "mtp-Clover-Tiny-Q4_K_M.gguf", files["known-mtp"])
    assert main(["download", "--repo", repo, "--quant", "Q4_K_M", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["architecture"] == {
        "name": "qwen35moe",
        "supported": True,
        "runner": "llama.cpp",
        "why": f"{', '.join(VERSIONS)} loads 'qwen35moe'",
        "runtime": None,
        "server_path": None,
        "server_source": None,
        "install": None,
        "install_command": None,
        "min_release": None,
        "runs_with": "the pinned llama.cpp (embedded engine or the built llama-server)",
    }
    assert Path(result["path"]).read_bytes() == files["known"].read_bytes()
    assert set(result["sidecars"]) == {"mtp"} and result["notes"] == [] and "note:" not in err
    size = files["known"].stat().st_size
    assert hub_server.bytes_served(repo, "Clover-Tiny-Q4_K_M.gguf") == size + ARCH_READ


def test_a_sidecar_of_an_unknown_architecture_is_skipped_and_the_model_downloads(
    hub_server: HubServer, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    repo = "acme/Clover-Mixed-GGUF"
    hub_server.add_file(repo, MODEL, files["known"])
    hub_server.add_file(repo, SIDECAR, files["unknown-mtp"])
    assert main(["download", "--repo", repo, "--quant", "Q4_K_M", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["sidecars"] == {} and [f["path"] for f in result["files"]] == [MODEL]
    assert Path(result["path"]).read_bytes() == files["known"].read_bytes()
    (note,) = result["notes"]
    assert note.startswith(f"The mtp sidecar {SIDECAR} is skipped: ") and f"'{UNKNOWN}'" in note
    assert f"note: {note}" in err and "The model downloads without it." in note
    assert hub_server.bytes_served(repo, SIDECAR) == ARCH_READ


def test_a_file_whose_header_cannot_be_read_is_not_downloaded_unchecked(
    hub_server: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = "acme/Broken-GGUF"
    hub_server.add_file(repo, "Broken-Q4_K_M.gguf", b"GGUF" + bytes(range(256)) * 64)
    assert main(["download", "--repo", repo, "--quant", "Q4_K_M"]) == 2
    err = capsys.readouterr().err
    assert "its GGUF header could not be read" in err and "Nothing was downloaded" in err and "--force" in err
    assert _blobs(repo) == []
    assert main(["download", "--repo", repo, "--quant", "Q4_K_M", "--force"]) == 0


def test_plan_json_carries_the_architecture(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    machine = ["--simulate", "ram=16G,cpu=4"]
    assert main(["plan", "--model", str(files["known"]), "--json", *machine]) == 0
    known = json.loads(capsys.readouterr().out)["architecture"]
    assert known["name"] == "qwen35moe" and known["supported"] is True and known["runner"] == "llama.cpp"
    assert set(known) == {"name", "supported", "runner", "why", "runs_with"} | {
        "runtime",
        "server_path",
        "server_source",
        "install",
        "install_command",
        "min_release",
    }

    assert main(["plan", "--model", str(files["unknown"]), "--json", *machine]) == 2
    _assert_the_refusal(capsys.readouterr().err, str(files["unknown"].resolve()), done="loaded")

    assert main(["plan", "--model", str(files["unknown"]), "--json", "--force", *machine]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert forced["architecture"]["supported"] is False and forced["architecture"]["runner"] is None
    assert any(r.startswith("--force: planned anyway: ") for r in forced["reasons"])


def test_plan_of_a_preset_refuses_from_the_hubs_header(
    unknown_repo: HubServer, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _preset_for(REPO)
    assert main(["plan", "--preset", "clover-next", "--simulate", "ram=16G,cpu=4"]) == 2
    err = capsys.readouterr().err
    _assert_the_refusal(err, f"{REPO} Q4_K_M")
    # Only headers travelled: the planner reads a quant's header, never its weights.
    for name, path in (("Clover-Next-Q8_0.gguf", files["unknown-q8"]), (MODEL, files["unknown"])):
        assert unknown_repo.bytes_served(REPO, name) <= max(_header_bytes(path), FIRST_READ_REMOTE)


def test_a_local_sidecar_of_an_unknown_architecture_is_left_out_of_the_plan(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / MODEL
    model.write_bytes(files["known"].read_bytes())
    (tmp_path / SIDECAR).write_bytes(files["unknown-mtp"].read_bytes())
    assert (
        main(["plan", "--model", str(model), "--json", "--spec", "auto", "--simulate", "ram=16G,cpu=4"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)
    skipped = [r for r in plan["reasons"] if r.startswith(f"The mtp sidecar {SIDECAR} is skipped")]
    assert skipped and "The model runs without it." in skipped[0]
    assert plan["speculative"]["mode"] != "mtp"


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--prompt", "hello"],
        ["chat"],
        ["serve", "--port", "18089"],
    ],
)
def test_run_chat_and_serve_refuse_a_local_file_before_loading_it(
    command: list[str],
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clover_local.engine import loader

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loader, "load_engine", no_load)
    path = files["unknown"]
    assert main([command[0], "--model", str(path), *command[1:]]) == 2
    _assert_the_refusal(capsys.readouterr().err, str(path.resolve()), done="loaded")


def _preset_for(repo: str) -> None:
    """A user preset ``clover-next``: the shipped Clover preset, fetched from ``repo``."""
    shipped = (Path(__file__).parent.parent / "presets" / "clover-35b-a3b.toml").read_text(encoding="utf-8")
    text = shipped.replace('name = "clover-35b-a3b"', 'name = "clover-next"').replace(
        'repo = "Diffuspace/Clover-35B-A3B-Preview-GGUF"', f'repo = "{repo}"'
    )
    folder = settings.user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "clover-next.toml").write_text(text, encoding="utf-8")


@pytest.mark.slow
async def test_the_plan_screen_shows_the_refusal_before_the_download_button(
    unknown_repo: HubServer, files: dict[str, Path]
) -> None:
    """On this machine the plan shows first from the preset's estimates (its architecture is known), then the
    Hub's GGUF header says what the file really is: the refusal takes the plan's place, Download is disabled."""
    from textual.widgets import Button, Static

    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen

    _preset_for(REPO)
    app = CloverApp(StartOptions(preset="clover-next"))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        summary = screen.query_one("#plan-summary", Static)
        await wait_until(lambda: f"'{UNKNOWN}'" in str(summary.render()), "the refusal", 120, pilot=pilot)
        text = str(summary.render())
        assert all(v in text for v in VERSIONS) and "--force" in text
        assert screen.plan is None and screen.query_one("#plan-download", Button).disabled
        await pilot.press("d")
        assert app.screen is screen  # nothing to download from
    # The headers were read (the planner's first 2 MiB of each quant), never the weights.
    assert unknown_repo.bytes_served(REPO, MODEL) <= FIRST_READ_REMOTE < files["unknown"].stat().st_size
