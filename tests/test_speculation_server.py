"""Speculation flags as the built llama-server runs them: every flag of every mode is in the vendored arg.cpp,
and the tiny qwen35moe with an MTP head (inside the file, or as an ``mtp-`` sidecar given with ``-md``) drafts
with ``--spec-type draft-mtp``: the reply's ``timings`` count drafted tokens. The draft context's memory in
llama.cpp's load log is what the plan said it would be.

Skipped without a built llama-server, except in CI (it builds one first)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from clover_local.detect import parse_simulate
from clover_local.engine.types import ChatMessage, Finished, GenerationRequest, GenerationStats
from clover_local.gguf.header import read_local_header
from clover_local.launch import LaunchRequest, decide_launch
from clover_local.llamacpp.binary import ServerBinary
from clover_local.llamacpp.server import plan_server_argv, start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.plan import memory
from clover_local.plan.llama_args import settings
from clover_local.plan.speculation import HeadOffer, speculate
from clover_local.plan.types import Plan, assemble
from clover_local.presets import load_preset
from clover_local.testing.models import tiny_mtp_model
from tests.helpers_serve import llama_server_path
from tests.test_llama_args import _arg_cpp_options


def plan_speculation(plan: Plan, *args: Any) -> Plan:
    """``plan`` with only its speculation stage (``plan.speculation.speculate``) after the placement."""
    return assemble(plan, None, speculate(plan, *args))


PROMPT = "Write a list of fruits, one per line, and say why each is good."


def mtp_plan(model: Path, spec: str = "mtp", machine: str = "ram=16G,cpu=2", ctx: int = 2048) -> Plan:
    """The plan of the launch that runs ``model`` in llama-server (budgeted for it). Only the plan is used: the
    binary named is never started (the tests start the built one with the plan's argv)."""
    request = LaunchRequest(
        load_preset("clover-35b-a3b"),
        str(model),
        ctx=ctx,
        threads=1,
        spec=spec,
        engine="llama-server",  # type: ignore[arg-type]
    )
    unstarted = ServerBinary(Path("/nonexistent/llama-server"), "test")
    return decide_launch(request, machine=parse_simulate(machine), find_binary=lambda _: unstarted).plan


def test_every_speculation_flag_is_in_arg_cpp() -> None:
    options = _arg_cpp_options()
    embedded, _ = tiny_mtp_model("embedded")
    side_model, _ = tiny_mtp_model("sidecar")
    plans = [mtp_plan(embedded), mtp_plan(side_model), mtp_plan(side_model, "ngram")]
    plans.append(replace(mtp_plan(side_model, machine="gpu=nvidia:8G,ram=16G"), n_cpu_moe=4))
    forced = mtp_plan(embedded, machine="gpu=nvidia:8G,ram=16G")
    desc = read_local_header(embedded)
    plans.append(
        plan_speculation(replace(forced, n_cpu_moe=4), desc, [HeadOffer("mtp", "embedded", None, desc)])
    )
    for kind in ("dflash", "dspark", "eagle3"):
        offer = HeadOffer(kind, "sidecar", f"/m/{kind}-x.gguf", desc)  # type: ignore[arg-type]
        plans.append(plan_speculation(forced, desc, [offer], kind))
    side = plan_speculation(
        replace(forced, n_cpu_moe=4), desc, [HeadOffer("mtp", "sidecar", "/m/mtp-x.gguf", desc)], "mtp"
    )
    plans.append(side)
    flags = {row.flag for plan in plans for row in settings(plan) if row.flag}
    assert flags - options == set(), f"flags not in arg.cpp: {flags - options}"
    assert {"--spec-type", "--spec-draft-n-max", "-md", "-ngld", "-ctkd", "-ctvd", "-cmoed", "-ot"} <= flags


@pytest.fixture(scope="module")
def binary() -> ServerBinary:
    return ServerBinary(llama_server_path(), "test")


def serve_once(binary: ServerBinary, plan: Plan, max_tokens: int = 48) -> tuple[GenerationStats, str]:
    """Start llama-server on the plan, one greedy reply; its stats and the server's log."""
    lines: list[str] = []
    # -lv 4: llama.cpp's load lines (the KV cache sizes) are logged at trace level in llama-server.
    argv = [*plan_server_argv(plan), "-lv", "4"]
    process = start_llama_server(argv, binary=binary, on_log=lines.append)
    try:
        engine = LlamaServerEngine(
            process, model_name="tiny", sampling=load_preset("clover-35b-a3b").sampling
        )
        request = GenerationRequest(
            messages=(ChatMessage("user", PROMPT),), max_tokens=max_tokens, temperature=0.0, seed=1
        )
        stats = next(e.stats for e in engine.generate(request) if isinstance(e, Finished))
    finally:
        process.stop()
    return stats, "\n".join(lines)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["embedded", "sidecar"])
def test_llama_server_drafts_with_the_mtp_head(binary: ServerBinary, where: str) -> None:
    model, side = tiny_mtp_model(where)  # type: ignore[arg-type]
    plan = mtp_plan(model)
    argv = plan_server_argv(plan)
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert ("-md" in argv) == (where == "sidecar")
    if side is not None:
        assert argv[argv.index("-md") + 1] == str(side)
    stats, log = serve_once(binary, plan)
    assert stats.completion_tokens > 0
    assert stats.drafted_tokens and stats.drafted_tokens > 0, log[-3000:]
    assert stats.accepted_tokens is not None and 0 <= stats.accepted_tokens <= stats.drafted_tokens
    # The draft context's KV cache is the one layer of the head, as long as the trunk's context.
    kv = [float(m) for m in re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", log)]
    (draft,) = [d for d in plan.speculative.draft_memory if d.device == "ram"]
    assert draft.kv_cache_bytes / memory.MIB in kv, (kv, log[-3000:])


@pytest.mark.slow
def test_bench_spec_modes_side_by_side_then_auto_uses_them(
    binary: ServerBinary, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from clover_local.cli import main

    monkeypatch.setenv("CLOVER_LLAMA_SERVER", str(binary.path))
    model, _ = tiny_mtp_model("sidecar")
    args = ["bench", "--spec-modes", "off,ngram,mtp,dflash", "--model", str(model), "--rounds", "1"]
    args += ["--max-tokens", "32", "--ctx", "2048", "--threads", "1", "--workloads", "code_rewrite", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["modes"] == ["off", "ngram", "mtp", "dflash"]
    assert "no dflash head" in data["errors"]["dflash"]
    assert set(data["ratios"]) == {"ngram", "mtp"}
    mtp = [s for s in data["samples"] if s["mode"] == "mtp"]
    assert mtp and all(s["drafted_tokens"] > 0 for s in mtp)

    assert main(["plan", "--model", str(model), "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["speculative"]
    assert "bench measured" in spec["why"]
    best = max(data["ratios"], key=lambda m: data["ratios"][m])
    assert spec["mode"] == (best if data["ratios"][best] >= 1.05 else "off")
