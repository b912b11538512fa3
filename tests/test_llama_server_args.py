"""Fitting a plan's argv to what a llama-server binary accepts, reading its --help, and reading
llama-fit-params' answer: pure functions, checked with help texts in llama.cpp's own layout (an old build's
and the vendored one's, written here; a newer upstream one's, laid out from upstream's own usage tables,
``tests/upstream_help.py``) and the example output from llama-fit-params' README."""

from __future__ import annotations

import pytest
from upstream_help import NEWER_README, help_from_readme

from clover_local.llamacpp.binary import (
    Capabilities,
    backends_from_devices,
    parse_builtin_templates,
    parse_devices,
    parse_help,
)
from clover_local.llamacpp.fit_params import parse_fit_output
from clover_local.llamacpp.server_args import adapt_args, n_cpu_moe_override, split_flags, with_endpoint


def _line(spec: str, text: str) -> str:
    """One option as ``common_arg::to_string`` prints it."""
    return f"{spec}\n{' ' * 40}{text}" if len(spec) > 37 else spec.ljust(40) + text


NEW_HELP = "\n".join(
    [
        "----- common params -----",
        "",
        _line("-h,    --help, --usage", "print usage and exit"),
        _line("-m,    --model FNAME", "model path"),
        _line("-c,    --ctx-size N", "size of the prompt context"),
        _line("-ngl,  --gpu-layers, --n-gpu-layers N", "max. number of layers to store in VRAM"),
        _line("-fa,   --flash-attn [on|off|auto]", "set Flash Attention use ('on', 'off', or 'auto')"),
        _line("-ncmoe, --n-cpu-moe N", "keep the MoE weights of the first N layers in the CPU"),
        _line(
            "-ot,   --override-tensor <tensor name pattern>=<buffer type>,...", "override tensor buffer type"
        ),
        _line("--spec-type [none|draft|ngram-simple|ngram-mod]", "type of speculative decoding"),
        _line("--spec-ngram-mod-n-max N", "max drafted tokens"),
        _line("--jinja, --no-jinja", "use jinja template for chat"),
        _line("--host HOST", "ip address to listen"),
        _line("--port PORT", "port to listen"),
        _line("--list-devices", "print list of available devices and exit"),
    ]
)

OLD_HELP = "\n".join(
    [
        _line("-m,    --model FNAME", "model path"),
        _line("-c,    --ctx-size N", "size of the prompt context"),
        _line("-ngl,  --gpu-layers, --n-gpu-layers N", "layers on the GPU"),
        _line("-fa,   --flash-attn", "enable Flash Attention"),
        _line("-ot,   --override-tensor <tensor name pattern>=<buffer type>,...", "override"),
        _line("--draft-max, --draft, --draft-n N", "number of tokens to draft"),
        _line("--host HOST", "ip"),
        _line("--port PORT", "port"),
    ]
)


def _caps(help_text: str) -> Capabilities:
    return Capabilities(version="b1-test", build_number=1, commit="test", flags=parse_help(help_text))


def test_parse_help_reads_names_hints_and_choices() -> None:
    flags = parse_help(NEW_HELP)
    assert flags["-c"] is flags["--ctx-size"]
    assert flags["--ctx-size"].value_hint == "N"
    assert flags["-ngl"].names == ("-ngl", "--gpu-layers", "--n-gpu-layers")
    assert flags["-fa"].choices == ("on", "off", "auto")
    assert flags["--spec-type"].choices == ("none", "draft", "ngram-simple", "ngram-mod")
    assert not flags["--jinja"].takes_value and "--no-jinja" in flags
    assert flags["-ot"].value_hint.startswith("<tensor name pattern>")
    assert "-----" not in flags and "--help" in flags


def test_split_flags_treats_negative_numbers_as_values() -> None:
    assert split_flags(["llama-server", "-m", "a.gguf", "-ngl", "-1", "--jinja", "-c", "8"]) == [
        ("-m", "a.gguf"),
        ("-ngl", "-1"),
        ("--jinja", None),
        ("-c", "8"),
    ]


PLAN_ARGV = [
    "-m", "m.gguf", "-c", "8192", "-ngl", "99", "--n-cpu-moe", "3", "-fa", "on",
    "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "--spec-ngram-mod-n-match", "24",
    "--load-mode", "mmap",
]  # fmt: skip


def test_vendored_build_accepts_supported_flags_unchanged() -> None:
    adapted = adapt_args(PLAN_ARGV, _caps(NEW_HELP))
    assert adapted.argv == PLAN_ARGV[:14]
    # Only what this help lacks is dropped, each with a warning naming it.
    assert "--spec-ngram-mod-n-match" not in adapted.argv and "--load-mode" not in adapted.argv
    assert len(adapted.warnings) == 2
    assert any("--load-mode mmap" in w.text for w in adapted.warnings)
    assert {w.code for w in adapted.warnings} == {"flag-dropped"}


def test_old_build_gets_translations() -> None:
    adapted = adapt_args(PLAN_ARGV, _caps(OLD_HELP))
    argv = adapted.argv
    assert argv[argv.index("--override-tensor") + 1] == n_cpu_moe_override(3)
    assert "--n-cpu-moe" not in argv
    i = argv.index("-fa")
    assert i == len(argv) - 1 or argv[i + 1].startswith("-")  # the old switch, without "on"
    assert "--spec-type" not in argv and "--draft-max" not in argv  # no speculation: its knobs go too
    text = " ".join(w.text for w in adapted.warnings)
    assert "--override-tensor" in text and "self-speculative" in text
    assert {w.code for w in adapted.warnings} >= {"flag-renamed", "flag-dropped"}


def test_flash_attn_off_on_old_switch_is_dropped_and_bad_choice_reported() -> None:
    assert "-fa" not in adapt_args(["-fa", "off"], _caps(OLD_HELP)).argv
    adapted = adapt_args(["-fa", "sometimes"], _caps(NEW_HELP))
    assert adapted.argv == [] and "not one of on|off|auto" in adapted.warnings[0].text


def test_spec_type_falls_back_to_an_ngram_type_the_build_has() -> None:
    help_text = _line("--spec-type [none|draft|ngram-simple]", "type")
    adapted = adapt_args(["--spec-type", "ngram-mod"], _caps(help_text))
    assert adapted.argv == ["--spec-type", "ngram-simple"]
    assert "ngram-simple" in adapted.warnings[0].text and adapted.warnings[0].code == "flag-renamed"


def test_n_cpu_moe_override_names_exactly_the_first_layers() -> None:
    import re

    pattern, target = n_cpu_moe_override(2).split("=")
    assert target == "CPU"
    assert re.search(pattern, "blk.0.ffn_up_exps.weight")
    assert re.search(pattern, "blk.1.ffn_gate_exps.weight")
    assert not re.search(pattern, "blk.2.ffn_up_exps.weight")
    assert not re.search(pattern, "blk.1.ffn_up_shexp.weight")


def test_with_endpoint_replaces_host_and_port() -> None:
    argv = with_endpoint(["-c", "8", "--port", "1", "--host", "0.0.0.0"], host="127.0.0.1", port=9000)
    assert argv == ["-c", "8", "--host", "127.0.0.1", "--port", "9000"]
    assert "--api-key-file" in with_endpoint([], host="h", port=1, api_key_file="/k")


def test_devices_and_backends() -> None:
    text = (
        "Available devices:\n  CUDA0: NVIDIA RTX 4090 (24076 MiB, 23000 MiB free)\n  Vulkan0: AMD (8 GiB)\n"
    )
    devices = parse_devices(text)
    assert devices == ("CUDA0: NVIDIA RTX 4090 (24076 MiB, 23000 MiB free)", "Vulkan0: AMD (8 GiB)")
    assert backends_from_devices(devices) == ("cuda", "vulkan", "cpu")
    assert backends_from_devices(parse_devices("Available devices:\n")) == ("cpu",)


def test_fit_output_from_the_readme_example() -> None:
    layers = ",".join(f"blk\\.{i}\\.ffn_(up|down|gate)_(ch|)exps=CPU" for i in range(14, 48))
    stdout = f'llama_params_fit: ok\n-c 4096 -ngl 48 -ot "{layers}"\n'
    fit = parse_fit_output(stdout)
    assert (fit.ctx, fit.n_gpu_layers) == (4096, 48)
    assert fit.expert_layers_on_cpu == tuple(range(14, 48))
    assert parse_fit_output("-c 2048 -ngl 0\n").overrides == ()


def test_builtin_template_name_turns_jinja_off_when_jinja_is_the_default() -> None:
    help_text = "\n".join(
        [
            _line("--jinja, --no-jinja", "whether to use jinja template engine for chat (default: enabled)"),
            _line("--chat-template JINJA_TEMPLATE", "set custom jinja chat template"),
            " " * 40 + "list of built-in templates:",
            " " * 40 + "chatml, gemma,",
            " " * 40 + "llama3",
            _line("--port PORT", "port"),
        ]
    )
    caps = Capabilities(
        version="v",
        build_number=1,
        commit=None,
        flags=parse_help(help_text),
        builtin_templates=parse_builtin_templates(help_text),
        jinja_by_default=True,
    )
    assert caps.builtin_templates == ("chatml", "gemma", "llama3")
    assert adapt_args(["--chat-template", "gemma"], caps).argv == ["--chat-template", "gemma", "--no-jinja"]
    custom = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert adapt_args(["--chat-template", custom], caps).argv == ["--chat-template", custom]


# -- a newer llama-server, as upstream documents it --------------------------------------------------------

_NEWER_TEXT = help_from_readme()
NEWER = Capabilities(
    version="00dc805 (tools/server/README.md)",
    build_number=None,
    commit="00dc805",
    flags=parse_help(_NEWER_TEXT),
    builtin_templates=parse_builtin_templates(_NEWER_TEXT),
    jinja_by_default=True,
)


def test_a_newer_help_is_read_with_its_renames_and_removals() -> None:
    flags = NEWER.flags
    for removed in ("--draft-max", "--draft", "--draft-n", "--draft-min", "--spec-ngram-size-n"):
        assert removed not in flags, f"{removed} is listed only to say it has been removed"
    assert flags["--fit"].choices == ("on", "off")
    assert {"ngram-mod", "draft-mtp", "draft-eagle3"} <= set(flags["--spec-type"].choices)
    assert flags["-ctkd"].names[0] == "--spec-draft-type-k" and flags["-md"].names[0] == "--spec-draft-model"
    assert "gemma" in NEWER.builtin_templates and "chatml" in NEWER.builtin_templates
    # Its own defaults differ from the pinned build's: the plan's argv must not lean on any of them.
    readme = NEWER_README.read_text()
    for default in (
        "port to listen (default: 9931)",
        "'on' or 'off', default: 'on'",
        "(default: -1, -1 = auto)",
    ):
        assert default in readme


def test_a_flag_listed_as_removed_is_dropped_with_a_notice_never_passed() -> None:
    adapted = adapt_args(["-c", "8", "--draft-max", "16"], NEWER)
    assert adapted.argv == ["-c", "8"]
    assert any("--draft-max 16" in w.text and w.code == "flag-dropped" for w in adapted.warnings)


PLANNED = [
    ("clover-35b-a3b", "ram=64G,gpu=nvidia:24G", 1),  # all on the GPU, n-gram speculation, -hf
    ("clover-35b-a3b", "ram=64G,gpu=nvidia:12G,gpu=nvidia:12G", 4),  # experts in RAM, two GPUs, 4 slots
    ("smollm2-135m", "ram=8G,cpu=4", 1),  # CPU only
    ("gemma3-270m", "ram=8G", 2),  # a built-in chat template, 2 slots
]


@pytest.mark.parametrize(("preset", "machine", "slots"), PLANNED)
def test_the_plan_runs_on_a_newer_llama_server_as_planned(preset: str, machine: str, slots: int) -> None:
    from pathlib import Path

    from clover_local.detect import parse_simulate
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.llamacpp.binary import ServerBinary

    request = LaunchRequest(preset, offline=True, describe=False, engine="llama-server", parallel=slots)
    newer = ServerBinary(Path("llama-server"), "the newer build")  # planned for, not run: its --help is NEWER
    launch = decide_launch(request, machine=parse_simulate(machine), find_binary=lambda _configured: newer)
    planned = launch.settings.argv(hf_repo=launch.preset.repo)
    adapted = adapt_args(planned, NEWER)
    assert adapted.argv == planned and adapted.warnings == ()  # every setting is one this build takes as is
    argv = with_endpoint(adapted.argv, host="127.0.0.1", port=8080)
    given = dict(split_flags(argv))
    assert all(NEWER.supports(flag) for flag in given)  # never a flag it does not take
    # Each default of this build the plan does not want is overridden explicitly, whatever the build's default.
    assert given["--fit"] == "off"  # on by default: it would re-fit what the plan decided
    assert given["--port"] == "8080"  # 9931 by default here, 8080 in the pinned build
    assert given["-np"] == str(launch.plan.parallel)  # auto by default, with a unified KV cache
    assert given["-ngl"] == ("all" if launch.plan.n_gpu_layers < 0 else str(launch.plan.n_gpu_layers))
    assert given["-c"] == str(launch.plan.ctx * launch.plan.parallel)
    if launch.plan.parallel > 1:
        assert "--no-kv-unified" in given  # each slot its own cells, as planned
    if "-hf" in given:
        assert "--no-mmproj" in given  # -hf would fetch and load a projector the plan holds no memory for


def test_the_printed_command_says_where_it_listens(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from clover_local.cli import main

    assert (
        main(["command", "--preset", "clover-35b-a3b", "--offline", "--simulate", "ram=64G", "--json"]) == 0
    )
    given = dict(split_flags(json.loads(capsys.readouterr().out)["argv"]))
    assert (given["--host"], given["--port"], given["--fit"]) == ("127.0.0.1", "8080", "off")
    assert "-hf" in given and "--no-mmproj" in given
