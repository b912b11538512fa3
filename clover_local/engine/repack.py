"""Weight repacking on the CPU that runs llama.cpp, for every process that loads a model.

The rule is the planner's (``plan.threads.cpu_repack``): the pinned llama.cpp's AMX kernels crash in
``llama_decode``, so where this CPU advertises AMX, repacking is off. A plan made for a described machine
(``--simulate``) cannot know that, so every place that starts llama.cpp applies the rule for the CPU it runs on:
the embedded engine's params (``engine.native``), llama-server's argv, and the tools (llama-diffusion-cli,
llama-fit-params, llama-bench)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


@lru_cache(maxsize=1)
def repack_safe_here() -> bool:
    """May llama.cpp repack weights on this machine's CPU?"""
    from clover_local.detect.probe import detect_cpu
    from clover_local.plan.threads import cpu_repack

    return cpu_repack(detect_cpu().features)[0]


def common_argv_here(argv: Sequence[str]) -> list[str]:
    """``argv`` of a tool that takes llama.cpp's common options (llama-server, llama-diffusion-cli,
    llama-fit-params), with ``--no-repack`` added where this CPU must not repack."""
    return with_repack_rule(argv, repack_safe_here())


def with_repack_rule(argv: Sequence[str], repack_safe: bool) -> list[str]:
    """``argv`` with ``--no-repack`` added where the CPU must not repack (``repack_safe`` False)."""
    out = list(argv)
    if not repack_safe and not {"--no-repack", "-nr"} & set(out):
        out.append("--no-repack")
    return out


def bench_argv_here(argv: Sequence[str]) -> list[str]:
    """``llama-bench``'s argv (its own parser: ``--repack 0|1``), with repacking off where it must be."""
    out = list(argv)
    if not repack_safe_here() and "--repack" not in out:
        out += ["--repack", "0"]
    return out
