"""Clover's plan before any runtime is installed (issue 40): budgeted for the runner that will run it (an
upstream llama-server, release b12060 or newer, as the preset says), offline too, with ``plan``, ``plan --json``,
``command`` and the app's plan screen showing the same flags and naming the release and its install command.

No runtime is installed (``CLOVER_RUNTIMES_DIR`` is an empty folder) and nothing is asked: ``--offline`` and
``HF_HUB_OFFLINE``, and the releases base is a closed port (``conftest``)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hub_server import HubServer

from clover_local.cli import main

PRESET = "clover-35b-a3b"
RELEASE = "b12060"
NEEDS = f"needs llama.cpp {RELEASE} or newer: install it with `clover-local runtime install {RELEASE}`"
MACHINES = (
    "ram=24G,cpu=8",  # a desktop without a GPU: Q4_K_M does not fit well
    "ram=16G,gpu=nvidia:8G,cpu=8",  # a laptop with an 8 GB card: nor here
    "gpu=nvidia:24G,ram=32G,cpu=8",  # a 24 GB card: the budgets of the two engines differ here
)


@pytest.fixture
def no_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "runtimes"
    folder.mkdir()
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(folder))
    return folder


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _without_model(argv: list[str]) -> list[str]:
    """llama-server's flags without the binary, the model (``-hf REPO:QUANT --no-mmproj`` or ``-m PATH``) and
    the endpoint a pasted command listens on (``--host``, ``--port``): the plan's own flags."""
    out = argv[1:] if argv and not argv[0].startswith("-") else list(argv)
    for flag in ("-hf", "-m", "--host", "--port"):
        if flag in out:
            at = out.index(flag)
            del out[at : at + 2]
    return [a for a in out if a != "--no-mmproj"]


@pytest.mark.parametrize("machine", MACHINES)
async def test_plan_command_json_and_the_app_agree_offline_with_no_runtime(
    no_runtime: Path, offline: None, machine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from textual.widgets import Static
    from waiting import wait_until

    from clover_local.detect import parse_simulate
    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen

    asked = ["--preset", PRESET, "--offline", "--simulate", machine]
    assert main(["plan", *asked, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["engine"] == "llama-server"  # the runner that will run it, not the embedded engine
    assert planned["architecture"]["install"] == RELEASE
    assert planned["architecture"]["install_command"] == f"clover-local runtime install {RELEASE}"
    assert planned["architecture"]["runs_with"] == NEEDS
    flags = planned["llama_server_args"]
    assert flags[flags.index("--spec-type") + 1] == "ngram-mod"  # llama-server's drafter: planned, not off
    assert not any("Speculation off" in r for r in planned["reasons"])

    assert main(["plan", *asked]) == 0
    text = capsys.readouterr().out
    assert f"Runs with: {NEEDS}" in text
    shown = text.split("Command (`clover-local command`):\n", 1)[1].splitlines()[0].strip()

    assert main(["command", *asked, "--json"]) == 0
    command = json.loads(capsys.readouterr().out)
    assert (
        command["needs"] == NEEDS and command["install_command"] == f"clover-local runtime install {RELEASE}"
    )
    assert main(["command", *asked]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"# {NEEDS}" and printed[-1] == command["command"] == shown

    assert _without_model(command["argv"]) == _without_model(shlex.split(shown)) == flags

    app = CloverApp(StartOptions(preset=PRESET), machine=parse_simulate(machine))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.launch is not None, "the plan", pilot=pilot)
        assert screen.launch is not None
        assert screen.launch.runner.kind == "llama-server" and screen.launch.plan.engine == "llama-server"
        assert _without_model(screen.launch.settings.argv()) == flags
        assert NEEDS in str(screen.query_one("#plan-summary", Static).render())
        assert f"Install llama.cpp {RELEASE}" in str(screen.query_one("#plan-install").render())


# -- a quant that fits: the community repos (item 5) --------------------------------------------------------

OFFICIAL = "Diffuspace/Clover-35B-A3B-Preview-GGUF"
COMMUNITY_MARK = "# -- community repos"
"""Where the shipped preset's [[community]] tables start: the stand-in's user preset lists its own instead."""
UNSLOTH_LIKE = "someone/Clover-35B-A3B-Preview-GGUF"
I1_LIKE = "other/Clover-35B-A3B-Preview-i1-GGUF"
LAYOUT: dict[str, dict[str, tuple[str, ...]]] = {
    OFFICIAL: {
        "Q4_K_M": ("Clover-35B-A3B-Preview-Q4_K_M.gguf",),
        "Q8_0": ("Clover-35B-A3B-Preview-Q8_0.gguf",),
    },
    UNSLOTH_LIKE: {  # quants named their own way, one of them split
        "Q3_K_XL": ("Clover-35B-A3B-Preview-UD-Q3_K_XL.gguf",),
        "IQ3_XXS": ("Clover-35B-A3B-Preview-UD-IQ3_XXS.gguf",),
        "Q2_K_XL": ("Clover-35B-A3B-Preview-UD-Q2_K_XL.gguf",),
        "Q4_K_S": (
            "Q4_K_S/Clover-35B-A3B-Preview-Q4_K_S-00001-of-00002.gguf",
            "Q4_K_S/Clover-35B-A3B-Preview-Q4_K_S-00002-of-00002.gguf",
        ),
    },
    I1_LIKE: {
        "Q3_K_M": ("Clover-35B-A3B-Preview.i1-Q3_K_M.gguf",),
        "IQ3_XXS": ("Clover-35B-A3B-Preview.i1-IQ3_XXS.gguf",),
    },
}
"""Clover-shaped GGUF headers (sparse files of the real sizes: Q4_K_M 21.1 GB, Q4_K_S 20.4 GB in two shards,
UD-Q3_K_XL 17.7 GB, Q3_K_M 17.5 GB, IQ3_XXS 15.0 GB, UD-Q2_K_XL 13.9 GB) as the repos would list them."""


@pytest.fixture(scope="module")
def clover_headers(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    from clover_local.testing.clover_shaped import write_clover_header

    root = tmp_path_factory.mktemp("clover-headers")
    out: dict[tuple[str, str], Path] = {}
    for repo, quants in LAYOUT.items():
        for quant, names in quants.items():
            paths = [root / repo.replace("/", "_") / name for name in names]
            for path in paths:
                path.parent.mkdir(parents=True, exist_ok=True)
            write_clover_header(paths, quant=quant)
            out |= {(repo, name): path for name, path in zip(names, paths, strict=True)}
    return out


@pytest.fixture
def community_hub(
    hub_server: HubServer, clover_headers: dict[tuple[str, str], Path], no_runtime: Path
) -> HubServer:
    """The Hub stand-in with the official repo and two community repos, and the Clover preset listing those
    two (a user preset of the same name: the shipped one lists none, none being confirmed yet)."""
    from clover_local import settings
    from clover_local.presets import shipped_presets_dir

    for (repo, name), path in clover_headers.items():
        hub_server.add_file(repo, name, path, sha256=f"{abs(hash(name)):064x}"[-64:])
    hub_server.add_file(UNSLOTH_LIKE, "README.md", "# Clover GGUFs\n")
    shipped = (shipped_presets_dir() / f"{PRESET}.toml").read_text()
    listed = "".join(
        f'[[community]]\nrepo = "{repo}"\nconfirmed = "the Hub stand-in (tests)"\n\n'
        for repo in (UNSLOTH_LIKE, I1_LIKE)
    )
    assert COMMUNITY_MARK in shipped
    user = settings.user_presets_dir()
    user.mkdir(parents=True, exist_ok=True)
    (user / f"{PRESET}.toml").write_text(shipped.split(COMMUNITY_MARK)[0] + "\n" + listed)
    return hub_server


@pytest.mark.parametrize(
    ("machine", "repo", "quant"),
    [
        ("ram=24G,cpu=8", UNSLOTH_LIKE, "Q4_K_S"),  # the split Q4_K_S fits 24 GB of RAM; Q4_K_M does not
        ("ram=16G,gpu=nvidia:8G,cpu=8", UNSLOTH_LIKE, "Q3_K_XL"),  # Q4_K_S does not; UD-Q3_K_XL does
    ],
)
def test_where_q4_k_m_does_not_fit_the_plan_names_a_community_quant_that_does(
    community_hub: HubServer, machine: str, repo: str, quant: str, capsys: pytest.CaptureFixture[str]
) -> None:

    asked = ["--preset", PRESET, "--simulate", machine]
    assert main(["plan", *asked, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["quant"] == "Q4_K_M" and planned["fits"] is False  # the preset's own: it says so ...
    assert "exact, from the GGUF header" in planned["size_sources"]["Q4_K_M"]
    pick = planned["community"]  # ... and names the best that fits
    command = f"clover-local download --repo {repo} --quant {quant}"
    assert (pick["repo"], pick["quant"], pick["command"]) == (repo, quant, command)
    assert pick["size_source"].startswith("exact, from the GGUF header of")
    assert pick["predicted_tokens_per_s"] > 0 and pick["ram_bytes"] > 0
    why = pick["why"]
    assert "quality order" in why and "tokens/s predicted" in why and f"`{command}`" in why
    assert why in planned["reasons"]
    if quant == "Q4_K_S":
        assert pick["files"] == list(LAYOUT[UNSLOTH_LIKE]["Q4_K_S"]) and "2 files" in why
        assert "Q3_K_XL of someone" in why  # weighed too: fits, lower in the quality order
    else:
        assert "Q4_K_S of someone" not in why  # larger than this machine could hold: its header not read
    assert main(["plan", *asked]) == 0
    shown = capsys.readouterr().out
    assert f"Fits instead: {quant} of {repo}" in shown

    # Headers only: a few MB of each file read, no model downloaded.
    for hub_repo, name in _files(community_hub):
        assert community_hub.bytes_served(hub_repo, name) < 16 * 1024 * 1024, name
    # The quant named plans as named, and fits: `plan --repo R --quant Q` is the same plan.
    assert main(["plan", "--repo", repo, "--quant", quant, *asked, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["fits"] is True and again["n_cpu_moe"] == pick["n_cpu_moe"]
    assert again["predicted_tokens_per_s"] == pick["predicted_tokens_per_s"]


def _files(hub: HubServer) -> list[tuple[str, str]]:
    return [(r, p) for r, repo in hub.repos.items() for p in repo.files if p.endswith(".gguf")]


def test_offline_it_names_the_repos_it_would_ask_and_asks_none(
    community_hub: HubServer, offline: None, capsys: pytest.CaptureFixture[str]
) -> None:
    community_hub.requests.clear()
    assert main(["plan", "--preset", PRESET, "--simulate", "ram=24G,cpu=8", "--offline", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["fits"] is False and planned["community"] is None
    said = [r for r in planned["reasons"] if r.startswith("Offline: the community repos")]
    assert said and UNSLOTH_LIKE in said[0] and I1_LIKE in said[0]
    assert community_hub.requests == []


def test_a_repo_that_cannot_be_listed_is_said_and_the_others_still_answer(
    community_hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    del community_hub.repos[I1_LIKE]
    assert main(["plan", "--preset", PRESET, "--simulate", "ram=16G,gpu=nvidia:8G,cpu=8", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["community"]["quant"] == "Q3_K_XL"
    assert any(f"The community repo {I1_LIKE} could not be listed" in r for r in planned["reasons"])


def test_a_plan_that_fits_asks_no_community_repo(
    community_hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    community_hub.requests.clear()
    assert main(["plan", "--preset", PRESET, "--simulate", "ram=64G,cpu=16", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["fits"] is True and planned["community"] is None
    assert not any(UNSLOTH_LIKE in r.path or I1_LIKE in r.path for r in community_hub.requests)


@pytest.mark.parametrize(
    ("better", "worse"),
    [
        ("Q4_K_M", "Q4_K_S"),
        ("Q4_K_S", "IQ4_XS"),
        ("Q3_K_XL", "Q3_K_L"),
        ("UD-Q3_K_XL", "Q3_K_M"),
        ("Q3_K_M", "IQ3_XXS"),
        ("iq3_xxs", "Q2_K"),
        ("Q2_K_XL", "Q2_K"),
        ("Q2_K", "IQ2_XXS"),
    ],
)
def test_the_quality_order_of_quant_types(better: str, worse: str) -> None:
    from clover_local.plan.quant_order import quality_rank

    a, b = quality_rank(better), quality_rank(worse)
    assert a is not None and b is not None and a < b
    assert quality_rank("APEX-I-NanoPlus") is None


def test_only_smaller_quants_that_could_fit_have_their_headers_read() -> None:
    from clover_local.plan.community import shortlist

    gb = 1_000_000_000
    listed = {"Q8_0": 37 * gb, "Q4_K_S": 20 * gb, "Q3_K_XL": 18 * gb, "IQ3_XXS": 15 * gb, "Q2_K": 14 * gb}
    listed |= {"APEX-I-NanoPlus": 13 * gb, "IQ2_XXS": 10 * gb}
    assert shortlist(listed, below_bytes=21 * gb, room_bytes=19 * gb) == ["Q3_K_XL", "IQ3_XXS", "Q2_K"]
    assert shortlist(listed, below_bytes=21 * gb, room_bytes=19 * gb, per_repo=9)[-2:] == [
        "IQ2_XXS",
        "APEX-I-NanoPlus",  # not a llama.cpp type: after every ranked one
    ]
    assert shortlist(listed, below_bytes=21 * gb, room_bytes=5 * gb) == []


async def test_the_apps_plan_screen_names_the_community_quant_that_fits(community_hub: HubServer) -> None:
    """The plan screen shows the plan at once; a worker then asks the community repos (the plan does not fit
    well), and the plan made again names the quant that fits and the command that gets it, as ``plan`` does."""
    from textual.widgets import Static
    from waiting import wait_until

    from clover_local.detect import parse_simulate
    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen

    app = CloverApp(StartOptions(preset=PRESET), machine=parse_simulate("ram=16G,gpu=nvidia:8G,cpu=8"))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.plan is not None and screen.plan.community is not None, pilot=pilot)
        assert screen.plan is not None and screen.plan.community is not None
        assert (screen.plan.community.repo, screen.plan.community.quant) == (UNSLOTH_LIKE, "Q3_K_XL")
        summary = str(screen.query_one("#plan-summary", Static).render())
        assert f"Fits instead: Q3_K_XL of {UNSLOTH_LIKE}" in summary
        assert f"clover-local download --repo {UNSLOTH_LIKE} --quant Q3_K_XL" in summary


# -- the runner's own GPU backends ------------------------------------------------------------------------------


def _runtime_with_devices(root: Path, devices: str) -> Path:
    """An installed runtime b12500 that knows clover_moe, whose llama-server lists ``devices``."""
    from helpers_runtimes import arch_cpp

    from clover_local.runtimes.installed import write_manifest
    from clover_local.testing.models import CLOVER_ARCH

    folder = root / "b12500"
    (folder / "bin").mkdir(parents=True)
    flags = ("-m,    --model FNAME", "-c,    --ctx-size N", "-ngl,  --n-gpu-layers N", "--list-devices")
    server = folder / "bin" / "llama-server"
    server.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "version: 12500 (abcdef123)"; exit 0; fi\n'
        f'if [ "$1" = "--list-devices" ]; then printf "Available devices:\\n{devices}"; exit 0; fi\n'
        "cat <<'EOF'\n" + "\n".join(f"{f:<37}   what it does" for f in flags) + "\nEOF\n"
    )
    server.chmod(0o755)
    (folder / "llama-arch.cpp").write_text(arch_cpp(CLOVER_ARCH))
    write_manifest(
        folder,
        {
            "tag": "b12500",
            "backend": "cuda",
            "origin": "archive",
            "server": "bin/llama-server",
            "installed": "now",
        },
    )
    return server


def _detected_with_a_cpu_wheel() -> object:
    """A detected (not described) machine with an NVIDIA card, whose llama-cpp-python is a CPU-only wheel."""
    from dataclasses import replace

    from clover_local.detect import parse_simulate
    from clover_local.detect.machine import LlamaBuild

    machine = parse_simulate("gpu=nvidia:24G,ram=32G,cpu=8")
    return replace(machine, simulated=False, build=LlamaBuild(version="0.3.36", gpu_offload=False))


@pytest.mark.parametrize(
    ("devices", "offloads"),
    [("  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23700 MiB free)\\n", True), ("", False)],
)
def test_llama_server_offloads_to_the_gpus_of_its_own_build(
    no_runtime: Path, offline: None, devices: str, offloads: bool
) -> None:
    """Clover runs in the runtime's llama-server: the plan offloads to the GPU backends that build lists, not
    llama-cpp-python's (a CPU wheel beside a CUDA runtime), and stays on the CPU with a CPU-only runtime."""
    from clover_local.launch import LaunchRequest, decide_launch

    _runtime_with_devices(no_runtime, devices)
    launch = decide_launch(LaunchRequest(PRESET, describe=False), machine=_detected_with_a_cpu_wheel())  # type: ignore[arg-type]
    assert launch.runner.runtime == "b12500"
    assert launch.machine.build.gpu_offload is offloads
    assert (launch.plan.n_gpu_layers != 0) is offloads and (launch.plan.backend == "cuda") is offloads


def test_before_the_runtime_is_installed_the_plan_offloads_as_the_installer_would(
    no_runtime: Path, offline: None
) -> None:
    from clover_local.launch import LaunchRequest, decide_launch

    launch = decide_launch(LaunchRequest(PRESET, describe=False), machine=_detected_with_a_cpu_wheel())  # type: ignore[arg-type]
    assert launch.runner.install == f"clover-local runtime install {RELEASE}"
    assert launch.machine.build.backends == ("cuda", "cpu") and launch.plan.n_gpu_layers != 0
    # A described machine keeps the build it describes.
    from clover_local.detect import parse_simulate

    cpu_build = parse_simulate("gpu=nvidia:24G,ram=32G,cpu=8,backend=cpu")
    assert decide_launch(LaunchRequest(PRESET, describe=False), machine=cpu_build).plan.n_gpu_layers == 0


# -- the commonest consumer machines, offline: the shipped preset's listed community files (issue 49) -----------

MINIPLUS = "IsValorum/Clover-35B-A3B-Preview-APEX-I-MiniPlus-V2.1-GGUF"
NANOPLUS = "IsValorum/Clover-35B-A3B-Preview-APEX-I-NanoPlus-V2.1-GGUF"


@pytest.mark.parametrize(
    ("machine", "repo", "quant"),
    [
        ("ram=16G,gpu=nvidia:8G", MINIPLUS, "APEX-I-MiniPlus-V2.1"),  # 13.7 GiB: experts partly in RAM
        ("ram=16G", NANOPLUS, "APEX-I-NanoPlus-V2.1"),  # 11.7 GiB: the only listed file 14.4 GiB holds
    ],
)
def test_offline_a_16_gb_machine_gets_a_file_that_fits_and_the_command_that_gets_it(
    no_runtime: Path, offline: None, machine: str, repo: str, quant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--preset", PRESET, "--simulate", machine, "--offline", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["quant"] == "Q4_K_M" and planned["fits"] is False
    pick = planned["community"]
    assert (pick["repo"], pick["quant"]) == (repo, quant)
    assert pick["command"] == f"clover-local download --repo {repo}"  # the repo's one model file
    assert pick["size_source"].startswith("estimated from the size its page lists")
    assert pick["ram_bytes"] > 0 and pick["predicted_tokens_per_s"] > 0
    # Advice only where it makes the plan fit: no context halves Q4_K_M into 16 GB, and a simulated machine
    # has no other programs to close.
    advice = next(r for r in planned["reasons"] if r.startswith("Does not fit well"))
    assert "--ctx" not in advice and "closing other programs" not in advice
    assert main(["plan", "--preset", PRESET, "--simulate", machine, "--offline"]) == 0
    shown = capsys.readouterr().out
    assert f"Fits instead: {quant} of {repo}" in shown and f"`clover-local download --repo {repo}`" in shown


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:9",  # a closed port: refused at once
        "http://hub.invalid",  # a name no resolver knows (RFC 6761): as on a machine with no route to the Hub
    ],
)
def test_with_the_hub_unreachable_a_16_gb_machine_still_gets_the_listed_file_that_fits(
    no_runtime: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not offline by choice (no ``HF_HUB_OFFLINE``): the Hub merely cannot be reached. The plan says so and
    weighs what the community repos' pages list, as offline, instead of naming nothing."""
    from huggingface_hub import constants, hf_api

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)
    assert main(["plan", "--preset", PRESET, "--simulate", "ram=16G", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["fits"] is False
    pick = planned["community"]
    assert (pick["repo"], pick["quant"]) == (NANOPLUS, "APEX-I-NanoPlus-V2.1")
    assert pick["command"] == f"clover-local download --repo {NANOPLUS}"
    assert pick["size_source"].startswith("estimated from the size its page lists")
    said = [r for r in planned["reasons"] if r.startswith("The community repos were not asked")]
    assert len(said) == 1 and "The sizes their pages list are weighed instead" in said[0], planned["reasons"]


def test_the_advice_names_a_smaller_context_only_where_it_fits(
    no_runtime: Path, offline: None, capsys: pytest.CaptureFixture[str]
) -> None:
    def advice(machine: str, ctx: int) -> str:
        asked = ["--simulate", machine, "--ctx", str(ctx), "--quant", "Q4_K_M", "--offline", "--json"]
        assert main(["plan", "--preset", PRESET, *asked]) == 0
        planned = json.loads(capsys.readouterr().out)
        return next(r for r in planned["reasons"] if r.startswith("Does not fit well"))

    # 131072 tokens of context is what breaks 27 GB: the largest halving that fits is named, and it does fit.
    said = advice("ram=27G", 131_072)
    assert "a smaller context (--ctx 32768)" in said
    assert (
        main(["plan", "--preset", PRESET, "--simulate", "ram=27G", "--ctx", "32768", "--offline", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["fits"] is True
    assert "--ctx" not in advice("ram=16G", 16_384)  # no context makes 21 GiB of weights fit 14 GiB
