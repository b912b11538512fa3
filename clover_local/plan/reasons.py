"""A plan's reasons and a launch's notices as values: each sentence people read carries a code that code reads.

A reason's text is for people and is improved freely; anything that keeps, drops, replaces or finds a reason
(the launch trading the one-slot reason for the MTP one, ``run`` saying how a diffusion model decodes, pooling
putting its reasons before the RAM line) goes by its :data:`ReasonCode`, never by how the sentence begins.
A :class:`Notice` is the same for what a launch tells the person beside its plan (:data:`NoticeCode` lists
what). ``tests/test_reasons_as_values.py`` checks that no code in the package reads a reason's, a notice's or
an error's text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

ReasonCode = Literal[
    # the planner (plan.planner, plan.slots, plan.threads)
    "quant",
    "placement",
    "gpu-split",
    "unified-memory",
    "ram",
    "context",
    "kv-cache-type",
    "recurrent-state",
    "checkpoints",
    "chat-template",
    "slots",
    "does-not-fit",
    "threads",
    "flash-attn",
    "runtime-overhead",
    "load-mode",
    "speculation-ngram",
    "speed-estimate",
    "speed-measured",
    "speed-not-predicted",
    "sizes-estimated",
    "repack",
    "prompt-cache",
    # diffusion models (plan.diffusion)
    "diffusion",
    "diffusion-unmasking",
    "diffusion-canvas",
    # the speculation mode (plan.speculation, runtime)
    "speculation-off",
    "speculation-mode",
    "verify-costs",
    # pooling over workers (plan.pooled)
    "pooling",
    "workers-unused",
    "workers-idle",
    "rpc-trust",
    "versus-alone",
    # what the launch adds (runtime, launch, plan.community)
    "sizes",
    "architecture",
    "sidecar-skipped",
    "community",
]
"""What a reason is about: short, stable identifiers, the only part of a reason code compares."""

LEADING: tuple[ReasonCode, ...] = (
    "quant",
    "placement",
    "pooling",
    "versus-alone",
    "rpc-trust",
    "does-not-fit",
    "community",
    "diffusion",
    "speed-measured",
    "speed-estimate",
    "speed-not-predicted",
)
"""The reasons that decide a plan, in the order people read them: which file, where it runs (pooled with other
machines: whether that beats this one alone, and that RPC trusts the network), whether it fits (and what fits
instead), how fast. A plan leads with these (what runs it is its own line, ``render.runs_with``);
the rest are folded: ``plan --why`` prints them, the app's plan screen expands them, ``plan --json`` has all."""


@dataclass(frozen=True)
class Reason:
    """One sentence of a plan's "why" (``text``, for people: rendered, in ``plan --json``, in the TUI) and what
    it is about (``code``, for code)."""

    code: ReasonCode
    text: str

    def __str__(self) -> str:
        return self.text


NoticeCode = Literal[
    "engine",  # which engine runs the launch, and why (decide.engine_notice)
    "flag-dropped",  # a flag or value this llama-server does not take, left out (llamacpp.server_args)
    "flag-renamed",  # a flag this llama-server calls otherwise, or an equivalent it has, used instead
    "flags-from-arg-cpp",  # a llama-server that could not be asked, fitted to the arg.cpp kept beside it
    "server-unasked",  # why a llama-server's --help could not be read (facts.ServerFacts.problem)
    "needs-rpc",  # only llama-server pools other machines' devices (decide.choose_runner)
    "needs-architecture",  # only llama-server's llama.cpp loads the model's architecture
    "needs-drafter",  # only llama-server runs the drafter asked for (DFlash, DSpark, EAGLE-3)
    "safer-launch",  # the load ran out of memory and a launch planned for less memory was loaded
    "context-limited",  # the app's saved context is more than the file takes: the largest it takes
    "chat-template",  # the GGUF has no chat template
    "speculation-off",  # the engine stopped drafting (a recurrent state it cannot roll back, MTP with slots)
    "verify-costs",  # what verifying a draft costs here, measured at the first load
    "pooling",  # the workers a plan pools, or why it does not (run)
    "diffusion",  # how a diffusion model is decoded (run)
]
"""What a notice is about: the part of a notice code compares."""


@dataclass(frozen=True)
class Notice:
    """One thing a launch tells the person (``text``: printed as ``note:``, in ``plan --json``) and what it is
    about (``code``, for code)."""

    code: NoticeCode
    text: str

    def __str__(self) -> str:
        return self.text


def find_notice(notices: Iterable[Notice], code: NoticeCode) -> Notice | None:
    """The first notice with ``code``, if any."""
    return next((n for n in notices if n.code == code), None)


def find_reason(reasons: Iterable[Reason], code: ReasonCode) -> Reason | None:
    """The first reason with ``code``, if any."""
    return next((r for r in reasons if r.code == code), None)


def leading_reasons(reasons: Iterable[Reason]) -> tuple[Reason, ...]:
    """The reasons that decide the plan (:data:`LEADING`), in that order."""
    return tuple(sorted((r for r in reasons if r.code in LEADING), key=lambda r: LEADING.index(r.code)))


def folded_reasons(reasons: Iterable[Reason]) -> tuple[Reason, ...]:
    """Every other reason, in the plan's order: what an expert reads after the leading ones."""
    return tuple(r for r in reasons if r.code not in LEADING)
