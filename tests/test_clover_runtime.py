"""Which llama.cpp runs a model the pinned one does not know (issue 25): the one architecture check, in its order
(the embedded engine, the newest installed runtime that knows it, else the latest upstream release named with
the command that installs it, else no), read from each llama.cpp's own ``llama-arch.cpp``; the launch that runs
the runtime's llama-server with the plan's flags fitted to *its* ``--help``; plan, ``plan --json`` and download
saying which runtime runs it or what to install, and no model byte fetched before that; the Clover preset's
memory model from the header's keys; community repos' quants picked as ``llama-server -hf`` picks them.

The upstream release is the releases stand-in (``releases_server``, fixture ``releases``); installed runtimes are folders in the layout of
``clover_local.runtimes.installed`` whose llama-server is a script that answers ``--version`` and ``--help``
(the real patched llama-server runs the model in ``test_clover_e2e.py``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers_runtimes import arch_cpp, host_asset, publish, releases, script_runtime, tar_gz
from hub_server import HubServer
from releases_server import REPO_PATH, ReleasesServer

from clover_local import settings
from clover_local.arch_support import ArchSupport, check_architecture, packaged_table, require_supported
from clover_local.cli import main
from clover_local.errors import ArchitectureError, UpstreamError
from clover_local.fetch import cache
from clover_local.fetch.quants import hf_pick, select_quant_files
from clover_local.fetch.repo_preset import preset_for_repo
from clover_local.runtimes.installed import write_manifest
from clover_local.runtimes.upstream import latest_arch_source
from clover_local.testing.models import CLOVER_ARCH, tiny_clover_model, tiny_model

RELEASE = "b12060"
BUILT_ARG_CPP = settings.llama_server_dir() / "arg.cpp"  # kept by scripts/build-llama-server; read at import
MACHINE = ["--simulate", "ram=16G,cpu=4"]
__all__ = ["releases"]  # the fixture

# llama-server --help as llama.cpp lays it out (names and value hint in the first 40 columns), without any
# self-speculation flag and without --load-mode: what an older or differently built runtime might list.
_HELP_FLAGS = (
    "-m,    --model FNAME",
    "-c,    --ctx-size N",
    "-ngl,  --gpu-layers, --n-gpu-layers N",
    "-fa,   --flash-attn [on|off|auto]",
    "-ctk,  --cache-type-k TYPE",
    "-ctv,  --cache-type-v TYPE",
    "-t,    --threads N",
    "-tb,   --threads-batch N",
    "-b,    --batch-size N",
    "-ub,   --ubatch-size N",
    "-np,   --parallel N",
    "--no-repack",
    "--fit [on|off]",
    "-ncmoe, --n-cpu-moe N",
    "-ot,   --override-tensor <tensor name pattern>=<buffer type>,...",
    "--host HOST",
    "--port PORT",
    "--api-key-file FNAME",
)


def _fake_runtime(root: Path, tag: str, known: tuple[str, ...]) -> Path:
    """An installed runtime ``tag`` whose llama.cpp knows ``known`` besides the pinned architectures."""
    folder = root / tag
    (folder / "bin").mkdir(parents=True)
    help_text = "\n".join(f"{flag:<37}   what it does" for flag in _HELP_FLAGS)
    server = folder / "bin" / "llama-server"
    server.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "version: {tag[1:]} (abcdef123)"; exit 0; fi\n'
        f"cat <<'EOF'\n{help_text}\nEOF\n"
    )
    server.chmod(0o755)
    (folder / "llama-arch.cpp").write_text(arch_cpp(*known))
    write_manifest(
        folder,
        {"tag": tag, "backend": "cpu", "origin": "archive", "server": "bin/llama-server", "installed": "now"},
    )
    return server


@pytest.fixture
def runtimes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "runtimes"
    folder.mkdir()
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(folder))
    return folder


@pytest.fixture
def upstream(releases: ReleasesServer) -> ReleasesServer:
    """The releases stand-in, whose latest release knows clover_moe."""
    releases.add_release(RELEASE)
    releases.add_raw(RELEASE, "src/llama-arch.cpp", arch_cpp(CLOVER_ARCH))
    return releases


# -- the upstream release's table ---------------------------------------------------------------------------


def test_the_latest_release_is_asked_once_and_kept(upstream: ReleasesServer) -> None:
    first = latest_arch_source()
    assert first.tag == RELEASE and CLOVER_ARCH in first.text
    assert upstream.paths() == [f"{REPO_PATH}/releases/latest", f"/raw/{RELEASE}/src/llama-arch.cpp"]
    again = latest_arch_source()
    assert again.text == first.text and len(upstream.paths()) == 2  # both kept in the cache dir
    assert latest_arch_source(offline=True).tag == RELEASE  # offline, the cache answers


def test_offline_with_nothing_kept_is_a_clear_error_and_asks_nobody(upstream: ReleasesServer) -> None:
    with pytest.raises(UpstreamError, match=r"Offline: the latest llama\.cpp release was not asked"):
        latest_arch_source(offline=True)
    assert upstream.paths() == []


def test_an_unreachable_or_wrong_server_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UpstreamError, match=r"127\.0\.0\.1:9 is unreachable"):
        latest_arch_source()  # conftest points the releases base at a closed port
    wrong = ReleasesServer().start()
    monkeypatch.setenv("CLOVER_LLAMACPP_RELEASES", wrong.api_url)
    monkeypatch.setenv("CLOVER_LLAMACPP_RAW", wrong.raw_url)
    try:
        wrong.add_release("latest-and-greatest")
        with pytest.raises(UpstreamError, match=r"not a llama\.cpp tag"):
            latest_arch_source()
        wrong.add_release(RELEASE)
        with pytest.raises(UpstreamError, match=r"llama-arch\.cpp does not exist \(404\)"):
            latest_arch_source()  # the tag is fine, its llama-arch.cpp is not there
    finally:
        wrong.stop()


# -- the one decision -------------------------------------------------------------------------------------


def test_known_to_the_pinned_llama_cpp_runs_embedded_whatever_is_installed(
    runtimes: Path, upstream: ReleasesServer
) -> None:
    _fake_runtime(runtimes, "b13000", (CLOVER_ARCH,))
    check = check_architecture("qwen35moe")
    assert (check.supported, check.runner, check.runtime) == (True, "llama.cpp", None)
    assert upstream.paths() == []  # nothing asked for what the pinned llama.cpp knows


def test_the_newest_installed_runtime_that_knows_it_runs_it(runtimes: Path, upstream: ReleasesServer) -> None:
    older = _fake_runtime(runtimes, "b12100", (CLOVER_ARCH,))
    newer = _fake_runtime(runtimes, "b12500", (CLOVER_ARCH,))
    _fake_runtime(runtimes, "b12900", ())  # newest, but does not know it
    check = check_architecture(CLOVER_ARCH)
    assert (check.supported, check.runner, check.runtime) == (True, "llama-server", "b12500")
    assert check.server_path == str(newer.resolve()) != str(older.resolve())
    assert "llama.cpp b12500" in check.runs_with and upstream.paths() == []


def test_with_no_runtime_the_latest_release_is_named_with_its_install_command(
    runtimes: Path, upstream: ReleasesServer
) -> None:
    check = check_architecture(CLOVER_ARCH)
    assert (check.supported, check.runner, check.install) == (False, None, RELEASE)
    assert check.install_command == f"clover-local runtime install {RELEASE}"
    assert f"the latest llama.cpp release, {RELEASE}, loads it" in check.why
    with pytest.raises(ArchitectureError) as err:
        require_supported(check, "acme/Clover-GGUF Q4_K_M", "download")
    assert f"`clover-local runtime install {RELEASE}`" in (err.value.fix or "")
    assert "pip install" not in str(err.value) and "Nothing was downloaded" in err.value.what
    assert require_supported(check, "x", "download", installable_ok=True) is check  # a plan may name it


def test_unknown_everywhere_offline_or_not(runtimes: Path, upstream: ReleasesServer) -> None:
    nobody = check_architecture("clover-next")
    assert not nobody.supported and nobody.install is None
    assert f"nor does the latest llama.cpp release, {RELEASE}" in nobody.why
    cache_dir = settings.cache_dir() / "upstream"
    for kept in sorted(cache_dir.rglob("*"), reverse=True):
        kept.unlink() if kept.is_file() else kept.rmdir()
    offline = check_architecture(CLOVER_ARCH, replace(_support(), look_upstream=False))
    assert not offline.supported and offline.install is None
    assert "offline, so the latest llama.cpp release was not asked" in offline.why


def _support() -> ArchSupport:
    return ArchSupport(packaged_table(), look_upstream=True)


# -- plan, plan --json, download ----------------------------------------------------------------------------


def test_plan_names_the_release_and_the_command(
    runtimes: Path, upstream: ReleasesServer, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny_clover_model())
    assert main(["plan", "--model", model, "--json", *MACHINE]) == 0
    arch = json.loads(capsys.readouterr().out)["architecture"]
    assert arch["name"] == CLOVER_ARCH and arch["supported"] is False and arch["install"] == RELEASE
    assert arch["install_command"] == f"clover-local runtime install {RELEASE}"
    assert main(["plan", "--model", model, *MACHINE]) == 0
    text = capsys.readouterr().out
    assert (
        f"Runs with: needs llama.cpp {RELEASE} or newer: install it with `clover-local runtime install {RELEASE}`"
        in text
    )
    # Running it is refused before anything loads, with the same one command.
    assert main(["run", "--model", model, "--prompt", "hi", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert f"clover-local runtime install {RELEASE}" in err and "Traceback" not in err


def test_plan_names_the_installed_runtime_and_fits_its_flags(
    runtimes: Path, upstream: ReleasesServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from clover_local.detect import parse_simulate
    from clover_local.launch import LaunchRequest, decide_launch

    server = _fake_runtime(runtimes, "b12500", (CLOVER_ARCH,))
    model = str(tiny_clover_model())
    assert main(["plan", "--model", model, "--json", *MACHINE]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("does not accept --load-mode" in n for n in out["notices"])
    dropped = {"code": "flag-dropped", "text": next(n for n in out["notices"] if "--load-mode" in n)}
    assert dropped in out["notes"] and "engine" in {n["code"] for n in out["notes"]}
    assert main(["command", "--model", model, *MACHINE]) == 0
    shown = capsys.readouterr().out.strip()
    assert shown.startswith(str(server.resolve())) and "--load-mode" not in shown
    arch = out["architecture"]
    assert (arch["supported"], arch["runtime"], arch["server_path"]) == (
        True,
        "b12500",
        str(server.resolve()),
    )

    launch = decide_launch(
        LaunchRequest(None, model, ctx=512, spec="ngram"), machine=parse_simulate("ram=16G,cpu=4")
    )
    assert launch.runner.kind == "llama-server" and launch.runner.runtime == "b12500"
    assert launch.runner.binary is not None and launch.runner.binary.path == server.resolve()
    assert launch.plan.engine == "llama-server" and launch.plan.speculative.mode == "ngram"
    planned = launch.settings.argv()
    assert "--spec-type" in planned and "--load-mode" in planned  # what the pinned llama.cpp would get
    # This runtime lists neither: they are dropped, each with a notice, and the command shown is what runs.
    assert "--spec-type" not in launch.argv and "--load-mode" not in launch.argv
    assert any("no self-speculative decoding" in n.text for n in launch.notices)
    assert any("does not accept --load-mode" in n.text for n in launch.notices)
    assert launch.command.startswith(str(server.resolve())) and "--spec-type" not in launch.command
    assert "-m" in launch.argv and model in launch.argv


def test_download_fetches_nothing_until_the_release_is_installed(
    runtimes: Path, upstream: ReleasesServer, hub_server: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = "acme/Clover-Tiny-GGUF"
    hub_server.add_file(repo, "Clover-Tiny-Q4_K_M.gguf", tiny_clover_model())
    assert main(["download", "--repo", repo, "--quant", "Q4_K_M"]) == 2
    err = capsys.readouterr().err
    assert f"`clover-local runtime install {RELEASE}`" in err and "Nothing was downloaded" in err
    assert _blobs(repo) == []

    _fake_runtime(runtimes, "b12500", (CLOVER_ARCH,))
    assert main(["download", "--repo", repo, "--quant", "Q4_K_M", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["architecture"]["runtime"] == "b12500" and len(_blobs(repo)) == 1
    assert Path(result["path"]).read_bytes() == tiny_clover_model().read_bytes()


def test_download_with_upstream_unreachable_fetches_nothing_and_says_why(
    runtimes: Path, hub_server: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = "acme/Clover-Tiny-GGUF"
    hub_server.add_file(repo, "Clover-Tiny-Q8_0.gguf", tiny_clover_model())
    assert main(["download", "--repo", repo, "--quant", "Q8_0"]) == 2
    err = capsys.readouterr().err
    assert "the latest llama.cpp release was not asked" in err and "is unreachable" in err
    assert "Nothing was downloaded" in err and _blobs(repo) == []


def _blobs(repo: str) -> list[str]:
    folder = cache.repo_folder(repo) / "blobs"
    return (
        sorted(p.name for p in folder.iterdir() if not p.name.endswith(".incomplete"))
        if folder.is_dir()
        else []
    )


# -- the Clover preset and its memory model ------------------------------------------------------------------


def test_the_clover_preset_expects_clovers_architecture_and_plans_ngram_only(
    runtimes: Path, upstream: ReleasesServer
) -> None:
    from clover_local.detect import parse_simulate
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.presets import load_preset

    preset = load_preset("clover-35b-a3b")
    a = preset.architecture
    assert (
        a.arch == CLOVER_ARCH and a.n_layers == 40 and len(a.attention_layers) == 10 and a.n_nextn_layers == 0
    )
    assert (a.n_expert, a.n_expert_used, a.n_expert_shared, a.expert_ffn) == (256, 8, 1, 512)
    launch = decide_launch(
        LaunchRequest("clover-35b-a3b", offline=True, spec="auto"), machine=parse_simulate("ram=64G,cpu=16")
    )
    plan = launch.plan
    assert plan.memory.ram.recurrent_state_bytes > 0 and plan.speculative.mode in ("ngram", "off")
    assert plan.architecture is not None and "header was not read" in plan.architecture.why
    # The embedded engine is not offered an MTP head the AR-only GGUF has not got.
    with pytest.raises(Exception, match=r"(?i)mtp"):
        decide_launch(
            LaunchRequest("clover-35b-a3b", offline=True, spec="mtp"),
            machine=parse_simulate("ram=64G,cpu=16"),
        )


def test_a_gated_deltanet_header_under_another_name_has_its_family_memory() -> None:
    """The memory family comes from what the header holds: a clover_moe header without
    ``full_attention_interval`` is planned with the Gated DeltaNet hybrids' interval, as qwen35moe."""
    from clover_local.gguf.describe import describe
    from clover_local.gguf.parse import parse_header

    clover = tiny_clover_model()
    header = parse_header(clover.read_bytes())
    kv = {k: v for k, v in header.kv.items() if k != f"{CLOVER_ARCH}.full_attention_interval"}
    without = describe([replace(header, kv=kv)], clover.stat().st_size, "test")
    qwen = describe([parse_header(tiny_model("qwen35moe").read_bytes())], clover.stat().st_size, "test")
    assert without.architecture.full_attention_interval == 4
    assert without.architecture.recurrent_state_bytes == qwen.architecture.recurrent_state_bytes > 0
    assert replace(without.architecture, arch="qwen35moe") == qwen.architecture


# -- community repos: quants as -hf picks them --------------------------------------------------------------

COMMUNITY = {
    "Clover-35B-A3B-Preview.Q8_0.gguf": 36_910_000_000,
    "Clover-35B-A3B-Preview.Q3_K_M.gguf": 16_000_000_000,
    "Clover-35B-A3B-Preview-IQ3_XXS.gguf": 13_500_000_000,
    "Clover-35B-A3B-Preview-APEX-I-NanoPlus.gguf": 12_560_000_000,
    "Q4_K_M/Clover-35B-A3B-Preview-Q4_K_M-00001-of-00002.gguf": 12_000_000_000,
    "Q4_K_M/Clover-35B-A3B-Preview-Q4_K_M-00002-of-00002.gguf": 9_000_000_000,
    "mmproj-Clover-F16.gguf": 900_000_000,
    "README.md": 1000,
}


@pytest.mark.parametrize(
    ("tag", "picked"),
    [
        (None, "Q4_K_M/Clover-35B-A3B-Preview-Q4_K_M-00001-of-00002.gguf"),  # Q4_K_M first, its first shard
        ("Q8_0", "Clover-35B-A3B-Preview.Q8_0.gguf"),
        ("q3_k_m", "Clover-35B-A3B-Preview.Q3_K_M.gguf"),  # case-insensitive
        ("IQ3_XXS", "Clover-35B-A3B-Preview-IQ3_XXS.gguf"),
        ("APEX-I", "Clover-35B-A3B-Preview-APEX-I-NanoPlus.gguf"),  # the tag, then "-" or "."
        ("NanoPlus", "Clover-35B-A3B-Preview-APEX-I-NanoPlus.gguf"),
        ("F16", None),  # only the mmproj has it: never a model
        ("Q2_K", None),
    ],
)
def test_hf_pick_is_llama_cpps_find_best_model(tag: str | None, picked: str | None) -> None:
    assert hf_pick(COMMUNITY, tag) == picked


def test_without_q4_or_q8_the_first_model_gguf_and_a_split_comes_whole() -> None:
    assert hf_pick({"b.IQ2_M.gguf": 1, "a-mmproj.gguf": 1, "c.IQ1_S.gguf": 1}, None) == "b.IQ2_M.gguf"
    assert select_quant_files("acme/x", COMMUNITY, None) == [
        "Q4_K_M/Clover-35B-A3B-Preview-Q4_K_M-00001-of-00002.gguf",
        "Q4_K_M/Clover-35B-A3B-Preview-Q4_K_M-00002-of-00002.gguf",
    ]
    assert select_quant_files("acme/x", COMMUNITY, "NanoPlus") == [
        "Clover-35B-A3B-Preview-APEX-I-NanoPlus.gguf"
    ]


def test_a_community_repo_offers_the_quants_its_files_name() -> None:
    from clover_local.presets import load_preset

    base = load_preset("clover-35b-a3b")
    preset = preset_for_repo(base, "someone/Clover-GGUF", COMMUNITY)
    assert set(preset.quants) == {"Q8_0", "Q3_K_M", "IQ3_XXS", "Q4_K_M"}
    assert preset.quants["Q4_K_M"].fallback_bytes == 21_000_000_000  # both shards
    assert preset.quants["Q8_0"].fallback_bytes == 36_910_000_000
    assert preset.repo == "someone/Clover-GGUF" and preset.architecture == base.architecture
    odd = preset_for_repo(base, "someone/Clover-GGUF", COMMUNITY, "APEX-I-NanoPlus")
    assert odd.quants["APEX-I-NanoPlus"].fallback_bytes == 12_560_000_000


def test_plan_repo_reads_a_community_quants_header(
    runtimes: Path, upstream: ReleasesServer, hub_server: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = "someone/Clover-Tiny-GGUF"
    hub_server.add_file(repo, "Clover-Tiny.IQ3_XXS.gguf", tiny_clover_model())
    assert main(["plan", "--repo", repo, "--quant", "IQ3_XXS", "--json", *MACHINE]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["quant"] == "IQ3_XXS" and out["architecture"]["install"] == RELEASE
    assert "exact, from the GGUF header of Clover-Tiny.IQ3_XXS.gguf" in json.dumps(out["size_sources"])
    assert _blobs(repo) == []  # the header only


# -- the app's plan screen ----------------------------------------------------------------------------------


@pytest.mark.parametrize("way", ["i", "f3"])
async def test_the_plan_screen_offers_the_install_and_runs_it_with_one_key(
    runtimes: Path, upstream: ReleasesServer, way: str
) -> None:
    """The Clover plan names the release to install and Download stays off; ``i`` opens the Runtimes screen,
    which installs that release with the real installer from the releases stand-in (an archive as upstream
    packs one, under the name this machine picks, with a llama-arch.cpp that knows clover_moe); back on the
    plan it is made again and names the installed runtime. The same when the Runtimes screen is opened with F3
    and the latest release installed there with its own ``i``."""
    from textual.widgets import Button, Static
    from waiting import wait_until

    from clover_local.detect import parse_simulate
    from clover_local.runtimes.installed import installed_runtimes
    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen
    from clover_local.tui.screens.runtimes import RuntimesScreen

    publish(upstream, RELEASE, tar_gz(script_runtime(RELEASE)), name=host_asset(RELEASE))
    upstream.add_raw(RELEASE, "src/llama-arch.cpp", arch_cpp(CLOVER_ARCH))
    app = CloverApp(StartOptions(preset="clover-35b-a3b"), machine=parse_simulate("ram=64G,cpu=16"))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.plan is not None, "the plan", pilot=pilot)
        summary = str(screen.query_one("#plan-summary", Static).render())
        assert f"needs llama.cpp {RELEASE}" in summary and f"runtime install {RELEASE}" in summary
        panel = screen.query_one("#machine-panel", Static)
        assert "llama.cpp  none here loads this model yet" in str(panel.render())  # not the pinned build
        button = screen.query_one("#plan-install", Button)
        assert button.display and RELEASE in str(button.label)
        assert screen.query_one("#plan-download", Button).disabled

        await pilot.press(way)
        await wait_until(lambda: isinstance(app.screen, RuntimesScreen), "the runtimes screen", pilot=pilot)
        runtimes_screen = app.screen
        assert isinstance(runtimes_screen, RuntimesScreen)
        if way == "i":
            assert runtimes_screen.install_at_once == RELEASE
        else:
            assert runtimes_screen.install_at_once is None
            await wait_until(lambda: runtimes_screen.latest is not None, "the latest release", pilot=pilot)
            await pilot.press("i")
        await wait_until(lambda: runtimes_screen.ended == 1, "the install to end", pilot=pilot)
        assert str(runtimes_screen.query_one("#runtime-error", Static).render()) == ""
        assert [rt.tag for rt in installed_runtimes()] == [RELEASE]
        assert runtimes_screen.installed_now is not None and runtimes_screen.installed_now.tag == RELEASE
        status = str(runtimes_screen.query_one("#runtime-status", Static).render())
        assert status.startswith("Ready:") and RELEASE in status, "the steps say 'Installed': said once"

        count = screen.plan_count
        await pilot.press("escape")  # the Runtimes screen returns what it installed
        await wait_until(lambda: app.screen is screen, "back to the plan", pilot=pilot)
        await wait_until(lambda: screen.plan_count > count, "the plan made again", pilot=pilot)
        assert screen.installing is None and not button.display
        assert screen.plan is not None and screen.plan.architecture is not None
        assert screen.plan.architecture.runtime == RELEASE
        assert f"llama.cpp {RELEASE} (installed runtime" in str(
            screen.query_one("#plan-summary", Static).render()
        )
        # the machine panel names the runtime the plan runs with, not the pinned llama.cpp (issue 49)
        shown = str(panel.render())
        assert f"llama.cpp  {RELEASE} (installed runtime" in shown and "llama-cpp-python" not in shown
        assert not screen.query_one("#plan-download", Button).disabled


CARD = "gpu=nvidia:24G,ram=32G,cpu=8"
"""A card on which the engines' budgets differ for Clover (llama-server holds less runtime memory)."""
QUANT_CARD = "gpu=nvidia:37.6G,ram=32G,cpu=8"
"""... and on which they pick different quants: Q8_0 fits whole for llama-server, not for the embedded engine
(which holds 0.65 GiB more CUDA runtime: Q8_0 fits it from 38 GB, llama-server from 37.4 GB)."""


async def test_the_plan_screen_shows_the_plan_of_the_launch_that_runs_it(
    runtimes: Path, upstream: ReleasesServer
) -> None:
    """Clover runs in llama-server (an installed runtime knows its architecture): the app's plan screen shows
    the plan of ``decide_launch``'s launch, budgeted for llama-server, not one budgeted for the embedded engine,
    and ``Download and run`` hands that very launch to the app."""
    from textual.widgets import Static
    from waiting import wait_until

    from clover_local.detect import parse_simulate
    from clover_local.launch import Launch, LaunchRequest, decide_launch
    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen

    _fake_runtime(runtimes, "b12500", (CLOVER_ARCH,))
    machine = parse_simulate(CARD)
    expected = decide_launch(LaunchRequest("clover-35b-a3b", describe=False), machine=machine)
    assert (expected.runner.kind, expected.plan.engine) == ("llama-server", "llama-server")
    app = CloverApp(StartOptions(preset="clover-35b-a3b"), machine=machine)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.plan is not None, "the plan", pilot=pilot)
        assert screen.launch is not None and screen.launch.runner == expected.runner
        assert screen.plan == expected.plan
        assert str(screen.query_one("#plan-summary", Static).render()).strip()
        dismissed: list[object] = []
        screen.dismiss = dismissed.append  # type: ignore[method-assign,assignment]
        screen.action_download()
        assert len(dismissed) == 1 and isinstance(dismissed[0], Launch) and dismissed[0] is screen.launch


def test_download_picks_the_quant_of_the_launch_that_runs_it(
    runtimes: Path, upstream: ReleasesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``download``'s automatic quant is the one ``clover-local plan`` and the launch choose: planned for
    llama-server, which runs Clover here, where the embedded engine's budget would pick another quant."""
    from clover_local import model_files
    from clover_local.commands.download import auto_quant
    from clover_local.detect import parse_simulate
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.plan.planner import make_plan
    from clover_local.plan.types import Wishes
    from clover_local.presets import load_preset

    _fake_runtime(runtimes, "b12500", (CLOVER_ARCH,))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the preset's estimates: no Hub asked
    machine = parse_simulate(QUANT_CARD)
    monkeypatch.setattr(model_files, "detect", lambda *_args: machine)  # this machine, as described
    preset = load_preset("clover-35b-a3b")
    launch = decide_launch(LaunchRequest(preset))
    embedded = make_plan(machine, preset, None, Wishes(engine="embedded"))  # what download once used
    assert launch.runner.kind == "llama-server" and launch.plan.quant != embedded.quant
    quant, note = auto_quant(preset)
    assert quant == launch.plan.quant, note


def test_a_launch_that_needs_an_install_is_shown_not_opened(
    runtimes: Path, upstream: ReleasesServer, tmp_path: Path
) -> None:
    from clover_local.launch import LaunchRequest, choose_runner, open_launch

    check = check_architecture(CLOVER_ARCH)
    runner = choose_runner(LaunchRequest(), check, find_binary=lambda _configured: None)
    assert (runner.kind, runner.binary, runner.install) == ("llama-server", None, check.install_command)
    own = tmp_path / "llama-server"
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755)
    theirs = choose_runner(LaunchRequest(llama_server=str(own)), check)
    assert theirs.binary is not None and theirs.binary.path == own.resolve() and theirs.install is None
    with pytest.raises(Exception, match=r"--engine embedded cannot run this"):
        choose_runner(LaunchRequest(engine="embedded"), check)

    from clover_local.detect import parse_simulate
    from clover_local.launch import decide_launch

    launch = decide_launch(
        LaunchRequest(None, str(tiny_clover_model()), ctx=512), machine=parse_simulate("ram=16G")
    )
    assert launch.runner.install == f"clover-local runtime install {RELEASE}"
    with pytest.raises(ArchitectureError, match="Nothing was loaded") as err:
        open_launch(launch)
    assert f"clover-local runtime install {RELEASE}" in (err.value.fix or "")


def test_a_runtime_whose_help_cannot_be_asked_is_fitted_from_its_kept_arg_cpp(
    runtimes: Path, upstream: ReleasesServer
) -> None:
    """The kept ``common/arg.cpp`` (the pinned one here, as beside the built llama-server) says what that
    llama.cpp accepts; an option it lacks is dropped with a notice, as ``--help`` would have it."""
    from clover_local.detect import parse_simulate
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.llamacpp.binary import capabilities_from_arg_cpp

    if not BUILT_ARG_CPP.is_file():
        pytest.skip("no kept arg.cpp (scripts/build-llama-server keeps one beside llama-server)")
    text = BUILT_ARG_CPP.read_text(encoding="utf-8")
    caps = capabilities_from_arg_cpp(text, "pinned")
    assert caps.spec("-fa") is not None and caps.spec("-fa").choices == ("on", "off", "auto")  # type: ignore[union-attr]
    assert caps.spec("-c") is not None and caps.spec("-c").takes_value  # type: ignore[union-attr]
    assert not caps.spec("--no-jinja").takes_value and not caps.spec("--jinja").takes_value  # type: ignore[union-attr]
    assert caps.spec("--spec-type") is not None and caps.spec("--spec-type").takes_value  # type: ignore[union-attr]

    server = _fake_runtime(runtimes, "b12500", (CLOVER_ARCH,))
    server.write_text("#!/bin/sh\nexit 1\n")  # answers nothing
    (runtimes / "b12500" / "arg.cpp").write_text(text.replace('"--load-mode"', '"--load-mode-gone"'))
    launch = decide_launch(
        LaunchRequest(None, str(tiny_clover_model()), ctx=512, spec="ngram"),
        machine=parse_simulate("ram=16G"),
    )
    assert "--spec-type" in launch.argv and "--load-mode" not in launch.argv
    assert any(
        "checked against the arg.cpp kept beside it" in n.text and n.code == "flags-from-arg-cpp"
        for n in launch.notices
    )
    assert any("does not accept --load-mode" in n.text for n in launch.notices)


def test_offline_plan_and_download_say_so_and_fetch_nothing(
    runtimes: Path,
    upstream: ReleasesServer,
    hub_server: HubServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Offline, the latest release is not asked; the Clover preset's word (``[runtime] min_release``) names the
    release to install, so a clover_moe file is still planned, for llama-server, and nothing is fetched."""
    model = str(tiny_clover_model())
    assert main(["plan", "--model", model, "--offline", "--json", *MACHINE]) == 0
    out = json.loads(capsys.readouterr().out)
    arch = out["architecture"]
    assert (arch["supported"], arch["install"], arch["min_release"]) == (False, RELEASE, RELEASE)
    assert "offline, so the latest llama.cpp release was not asked" in arch["why"]
    assert f"the preset clover-35b-a3b says llama.cpp {RELEASE} or newer loads it" in arch["why"]
    assert out["engine"] == "llama-server" and "--spec-type" in out["llama_server_args"]
    assert upstream.paths() == []  # nobody asked

    repo = "acme/Clover-Tiny-GGUF"
    hub_server.add_file(repo, "Clover-Tiny-Q4_K_M.gguf", tiny_clover_model())
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main(["download", "--repo", repo, "--quant", "Q4_K_M"]) != 0
    err = capsys.readouterr().err
    assert "offline" in err.lower() and "Traceback" not in err
    assert _blobs(repo) == [] and upstream.paths() == []
