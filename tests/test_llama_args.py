"""The one settings table: exact argv and kwargs for a few plans, the two agreeing, every flag existing in the
vendored llama.cpp ``common/arg.cpp``, and the kwargs loading the real Gemma 3 270M with the memory the model
predicts (KV cache and compute buffer read back from llama.cpp's own log)."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest

from clover_local import settings as clover_settings
from clover_local.detect import parse_simulate
from clover_local.engine.native import ENGINE_ONLY_KEYS
from clover_local.gguf.model import describe_from_preset
from clover_local.plan import memory
from clover_local.plan.llama_args import (
    GGML_TYPES,
    llama_cpp_kwargs,
    llama_server_args,
    n_cpu_moe_overrides,
    settings,
)
from clover_local.plan.planner import make_plan
from clover_local.plan.types import Plan, Wishes
from clover_local.presets import load_preset

ARG_CPP_CANDIDATES = (
    # scripts/build-llama-server keeps the option table of the source it built from (scripts/test runs it).
    clover_settings.llama_server_dir() / "arg.cpp",
    Path("/tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/common/arg.cpp"),
    Path(__file__).resolve().parent.parent / "vendor" / "llama.cpp" / "common" / "arg.cpp",
)


def clover_plan(spec: str, **wishes) -> Plan:
    return make_plan(parse_simulate(spec), load_preset("clover-35b-a3b"), None, Wishes(**wishes))


def test_exact_argv_and_kwargs_for_a_12g_gpu() -> None:
    plan = clover_plan("gpu=nvidia:12G,ram=32G,cpu=8")
    n = plan.n_cpu_moe
    assert llama_server_args(plan) == [
        "-c", "16384", "-ngl", "all", "--n-cpu-moe", str(n), "-fa", "on", "-ctk", "f16", "-ctv", "f16",
        "-t", "8", "-tb", "8", "-b", "2048", "-ub", "512", "--load-mode", "mmap", "-np", "1",
        "--ctx-checkpoints", "8", "--cache-ram", str(plan.prompt_cache_mib),
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-min", "2",
        "--spec-ngram-mod-n-max", "16", "--fit", "off",
    ]  # fmt: skip
    assert llama_cpp_kwargs(plan) == {
        "n_ctx": 16384,
        "n_gpu_layers": -1,
        "tensor_buft_overrides": [f"blk\\.{i}\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU" for i in range(n)],
        "flash_attn": True,
        "type_k": 1,
        "type_v": 1,
        "n_threads": 8,
        "n_threads_batch": 8,
        "n_batch": 2048,
        "n_ubatch": 512,
        "use_mmap": True,
        "use_mlock": False,
        "n_seq_max": 1,
        "kv_unified": False,
        "swa_full": False,
        "offload_kqv": True,
        "ctx_checkpoints": 8,
        "split_mode": 1,
        "main_gpu": 0,
        "tensor_split": None,
        # The embedded engine's own: Clover is hybrid; its n-gram drafts are rolled back from a copy of the state,
        # not through llama.cpp's snapshots (plan.memory.rollback_snapshots)
        "n_rs_seq": 0,
        "n_outputs_max_per_seq": 17,
        "backend_sampling": True,
    }


def test_exact_argv_for_cpu_only_with_model_path() -> None:
    plan = make_plan(
        parse_simulate("ram=16G,cpu=4"),
        load_preset("gemma3-270m"),
        None,
        Wishes(),
        model_path="/m/gemma.gguf",
    )
    assert llama_server_args(plan) == [
        "-m", "/m/gemma.gguf", "-c", "4096", "-ngl", "0", "-fa", "on", "-ctk", "f16", "-ctv", "f16",
        "-t", "4", "-tb", "4", "-b", "2048", "-ub", "512", "--load-mode", "mmap", "-np", "1",
        "--chat-template", "gemma", "--no-jinja", "--cache-ram", str(plan.prompt_cache_mib), "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24",
        "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "16", "--fit", "off",
    ]  # fmt: skip
    assert (
        64 <= plan.prompt_cache_mib <= 8192
    )  # the 16 GB machine's free RAM after a 270M model, at most the default
    kwargs = llama_cpp_kwargs(plan)
    assert kwargs["model_path"] == "/m/gemma.gguf" and kwargs["n_gpu_layers"] == 0
    assert kwargs["chat_format"] == "gemma" and kwargs["tensor_buft_overrides"] == []


def test_two_gpus_emit_split_and_full_offload_loads_without_mmap() -> None:
    plan = clover_plan("gpu=nvidia:24G,gpu=nvidia:24G,ram=64G")
    argv = llama_server_args(plan)
    ts = ",".join(f"{s:g}" for s in plan.tensor_split)
    assert argv[argv.index("-ts") + 1] == ts and argv[argv.index("-sm") + 1] == "layer"
    assert argv[argv.index("--load-mode") + 1] == "none"
    kwargs = llama_cpp_kwargs(plan)
    assert kwargs["tensor_split"] == list(plan.tensor_split) and kwargs["use_mmap"] is False


def test_q8_kv_reaches_both_sides() -> None:
    plan = clover_plan("gpu=nvidia:24G,ram=64G", ctx=131072)
    argv, kwargs = llama_server_args(plan), llama_cpp_kwargs(plan)
    assert argv[argv.index("-ctk") + 1] == "q8_0" == argv[argv.index("-ctv") + 1]
    assert kwargs["type_k"] == kwargs["type_v"] == 8


@pytest.mark.parametrize(
    "spec",
    ["ram=16G", "ram=64G", "gpu=nvidia:8G,ram=32G", "gpu=nvidia:24G,gpu=nvidia:12G,ram=64G", "unified=36G"],
)
def test_args_and_kwargs_agree(spec: str) -> None:
    plan = clover_plan(spec)
    argv, kwargs = llama_server_args(plan), llama_cpp_kwargs(plan)

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert int(flag("-c")) == kwargs["n_ctx"]
    assert (flag("-ngl") == "all") == (kwargs["n_gpu_layers"] == -1)
    assert int(flag("-t")) == kwargs["n_threads"] == plan.threads
    # llama-server batches on the decode threads (no load guard); the embedded engine gets every planned core
    assert int(flag("-tb")) == plan.threads and kwargs["n_threads_batch"] == plan.threads_batch
    assert int(flag("-b")) == kwargs["n_batch"] and int(flag("-ub")) == kwargs["n_ubatch"]
    assert GGML_TYPES[flag("-ctk")] == kwargs["type_k"] and GGML_TYPES[flag("-ctv")] == kwargs["type_v"]
    assert (flag("-fa") == "on") == kwargs["flash_attn"]
    assert (flag("--load-mode") in ("mmap", "auto", "mmap+mlock")) == kwargs["use_mmap"]
    n_moe = int(flag("--n-cpu-moe")) if "--n-cpu-moe" in argv else 0
    assert kwargs["tensor_buft_overrides"] == n_cpu_moe_overrides(n_moe)


def test_overrides_are_what_llama_cpp_builds_for_n_cpu_moe() -> None:
    (regex,) = n_cpu_moe_overrides(1)
    pattern, _, buft = regex.rpartition("=")
    assert buft == "CPU"
    assert re.search(pattern, "blk.0.ffn_gate_exps.weight") and re.search(
        pattern, "blk.0.ffn_down_exps.weight"
    )
    assert re.search(pattern, "blk.0.ffn_gate_up_exps.weight") and re.search(
        pattern, "blk.0.ffn_up_chexps.weight"
    )
    assert not re.search(pattern, "blk.0.ffn_gate_shexp.weight") and not re.search(
        pattern, "blk.10.ffn_up_exps.w"
    )


def _arg_cpp_options() -> set[str]:
    path = next((p for p in ARG_CPP_CANDIDATES if p.is_file()), None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("common/arg.cpp not found: scripts/build-llama-server keeps it beside llama-server")
        pytest.skip("vendored llama.cpp common/arg.cpp not available (run scripts/build-llama-server)")
    text = path.read_text(encoding="utf-8")
    names: set[str] = set()
    # An option is `common_arg({"-x", "--xx"}, ...)`, booleans with a second group: `{"--jinja"}, {"--no-jinja"}`.
    for first, negated in re.findall(r"common_arg\(\s*\{([^}]*)\}(?:\s*,\s*\{([^}]*)\})?", text):
        names.update(re.findall(r'"(-[^"]+)"', first + negated))
    return names


def test_every_flag_exists_in_vendored_arg_cpp() -> None:
    options = _arg_cpp_options()
    assert "--n-cpu-moe" in options and "-ngl" in options  # the parser found the table
    plans = [
        clover_plan(s)
        for s in ("ram=16G", "gpu=nvidia:12G,ram=32G", "gpu=nvidia:24G,gpu=nvidia:24G,ram=64G", "unified=36G")
    ]
    plans.append(make_plan(parse_simulate("ram=16G"), load_preset("gemma3-270m"), None, Wishes(), "/x.gguf"))
    plans.append(clover_plan("gpu=nvidia:24G,ram=64G", ctx=131072))
    flags = {row.flag for plan in plans for row in settings(plan) if row.flag}
    assert flags - options == set(), f"flags not in arg.cpp: {flags - options}"
    assert {
        "-ts",
        "-sm",
        "--chat-template",
        "--no-jinja",
        "--n-cpu-moe",
        "--spec-type",
        "--fit",
        "-m",
    } <= flags


def test_kwargs_are_llama_init_keywords_and_type_ids_match_ggml() -> None:
    import llama_cpp

    params = inspect.signature(llama_cpp.Llama.__init__).parameters
    plan = clover_plan("gpu=nvidia:24G,gpu=nvidia:12G,ram=64G")
    for key in llama_cpp_kwargs(plan):
        # The loader's own keys (engine.native.build_params sets them on llama_context_params directly) and
        # the embedded engine's (engine.checkpoints).
        own = ("tensor_buft_overrides", "n_seq_max", "kv_unified")
        assert key in own or key in params or key in ENGINE_ONLY_KEYS, key
    for name, value in GGML_TYPES.items():
        if name != "bf16":  # llama_cpp exports no BF16 constant; ggml.h has GGML_TYPE_BF16 = 30
            assert getattr(llama_cpp, f"GGML_TYPE_{name.upper()}") == value


@pytest.mark.slow
def test_gemma_loads_with_the_kwargs_and_llama_cpp_agrees_with_the_memory_model() -> None:
    from clover_local.engine.native import LogCapture, load_llama
    from clover_local.testing.models import gemma_path

    preset = load_preset("gemma3-270m")
    path = str(gemma_path())
    plan = make_plan(parse_simulate("ram=16G,cpu=2"), preset, None, Wishes(ctx=4096, threads=1), path)
    kwargs = llama_cpp_kwargs(plan)
    assert kwargs.pop("tensor_buft_overrides") == []
    kwargs.pop("chat_format")  # the engine applies the template; not needed to load
    # llama.cpp's log goes through one process-wide callback (the engine's, once any engine test has run): read
    # it there, not from stderr.
    with LogCapture() as capture:
        llm = load_llama(kwargs.pop("model_path"), **kwargs, verbose=False)
    try:
        assert llm.n_ctx() == 4096
    finally:
        llm.close()
    log = capture.text
    kv_mib = sum(float(m) for m in re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", log))
    compute_mib = float(re.search(r"CPU compute buffer size =\s+([\d.]+) MiB", log).group(1))
    arch = preset.architecture
    assert kv_mib * memory.MIB == memory.kv_cache_bytes(arch, 4096)  # 12 MiB global + 15 MiB SWA, exact
    planned_compute = memory.compute_buffer_bytes(arch, plan.n_ubatch)
    assert abs(planned_compute - compute_mib * memory.MIB) <= 0.01 * planned_compute
    ram = plan.memory.ram
    # The KV cache in RAM: its cells, and llama.cpp's index of them on the heap.
    assert ram.kv_cache_bytes == memory.kv_cache_bytes(arch, 4096) + memory.kv_cell_index_bytes(arch, 4096)
    # CPU-only: every weight is in RAM (up to the per-layer integer division of the preset estimate).
    assert abs(ram.weights_bytes - describe_from_preset(preset, "Q4_K_M").file_bytes) <= arch.n_layers


def test_a_hybrid_plan_gets_snapshots_and_a_whole_verification_ubatch_only_for_a_drafter_head() -> None:
    """The loader's rules live in the settings table: a recurrent/hybrid model whose MTP head drafts gets one
    rollback snapshot per drafted token and a ubatch that holds a whole verification, in argv and kwargs alike;
    n-gram drafting (rolled back from a copy of the state, as llama-server does), a plain model and a plan
    without speculation get neither."""
    from dataclasses import replace

    from clover_local.plan.llama_args import llama_settings
    from clover_local.plan.types import SpeculativePlan

    base = replace(clover_plan("gpu=nvidia:12G,ram=32G,cpu=8"), n_batch=4, n_ubatch=4)
    assert base.recurrent and base.speculative.enabled and base.speculative.mode == "ngram"
    plan = replace(base, speculative=replace(base.speculative, mode="mtp"))
    n_max = plan.speculative.n_max
    rendered = llama_settings(plan)
    kwargs, argv = rendered.kwargs(), rendered.argv()
    assert kwargs["n_rs_seq"] == memory.rollback_snapshots(plan.speculative) == n_max + 1
    assert kwargs["n_ubatch"] == n_max + 2 and kwargs["n_batch"] == n_max + 2
    assert kwargs["n_outputs_max_per_seq"] == n_max + 1
    assert argv[argv.index("-ub") + 1] == str(n_max + 2) and argv[argv.index("-b") + 1] == str(n_max + 2)
    assert "n_rs_seq" not in " ".join(argv)  # an embedded-only row: llama-server asks for its own snapshots

    ngram = llama_settings(base).kwargs()
    assert (ngram["n_rs_seq"], ngram["n_ubatch"], ngram["n_batch"]) == (0, 4, 4)
    assert ngram["n_outputs_max_per_seq"] == n_max + 1  # a verified draft still has a row per token
    plain = llama_settings(replace(plan, recurrent=False)).kwargs()
    assert (plain["n_rs_seq"], plain["n_ubatch"], plain["n_batch"]) == (0, 4, 4)
    off = llama_settings(replace(plan, speculative=SpeculativePlan(enabled=False))).kwargs()
    assert (off["n_rs_seq"], off["n_ubatch"], off["n_outputs_max_per_seq"]) == (0, 4, 1)
    cpu = llama_settings(replace(plan, n_gpu_layers=0)).kwargs()
    assert kwargs["backend_sampling"] and not cpu["backend_sampling"]


def test_the_command_shown_and_the_embedded_settings_agree_on_a_hybrid_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``clover-local command`` for the tiny hybrid model and the embedded launch of the same request: every
    setting both engines take has the same value, and the embedded one asks for no snapshots for n-gram drafts."""
    import json

    from clover_local.cli import main
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.testing.models import tiny_model

    model = str(tiny_model("qwen35moe"))
    machine = "ram=16G,cpu=4"
    shown = [
        "command",
        "--model",
        model,
        "--simulate",
        machine,
        "--spec",
        "ngram",
        "--parallel",
        "1",
        "--json",
    ]
    assert main(shown) == 0
    argv = json.loads(capsys.readouterr().out)["argv"]
    request = LaunchRequest(None, model, engine="embedded", spec="ngram")
    launch = decide_launch(request, machine=parse_simulate(machine))
    kwargs = launch.settings.kwargs()
    shared = {"-c": "n_ctx", "-b": "n_batch", "-ub": "n_ubatch", "-t": "n_threads", "-np": "n_seq_max"}
    assert {flag: argv[argv.index(flag) + 1] for flag in shared} == {
        f: str(kwargs[k]) for f, k in shared.items()
    }
    assert launch.plan.recurrent and launch.plan.speculative.enabled
    assert kwargs["n_rs_seq"] == memory.rollback_snapshots(launch.plan.speculative) == 0
