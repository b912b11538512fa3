"""Decode speeds measured on this machine (llama-bench runs that ``clover-local bench --llama-bench`` records),
used by the planner instead of its estimate. Pure: the records are read elsewhere and passed in.

A record names the machine (CPU and GPUs), the model file (quant and size) and the placement it was measured
at (GPU layers, experts in RAM), with the measured tokens/s and what the speed model predicted for that same
placement. The planner then says, for its own placement:

- *measured*: a record of this machine, model and placement: its tokens/s;
- *calibrated*: records of this machine and model at other placements: the model's estimate scaled by how far
  off it was there (the median ratio measured / predicted);
- *estimate*: none of either.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from clover_local.detect.machine import Machine

SpeedSource = Literal["measured", "calibrated", "estimate"]


@dataclass(frozen=True)
class SpeedRecord:
    machine: str
    """:func:`machine_key` of the machine it was measured on."""
    model: str
    """:func:`model_key` of the file."""
    n_gpu_layers: int
    n_cpu_moe: int
    tokens_per_s: float
    """Decode (llama-bench ``tg``) tokens per second."""
    predicted_tokens_per_s: float
    """What the speed model predicted for this placement when it was measured."""
    tool: str = "llama-bench"
    when: str = ""
    threads: int = 0
    """Decode threads it was measured with; 0: not recorded (older records), taken for any count."""


def machine_key(machine: Machine) -> str:
    """What identifies a machine for speed records: CPU model and cores, each GPU and its memory, the backend."""
    gpus = ",".join(f"{g.name}:{g.total_bytes // 2**30}G" for g in machine.gpus)
    return f"{machine.cpu.model}/{machine.cpu.logical_cores}c|{gpus or 'no gpu'}|{machine.offload_backend}"


def model_key(quant: str | None, file_bytes: int) -> str:
    """What identifies a model file for speed records: its quant and exact size."""
    return f"{quant or '?'}:{file_bytes}"


def apply_measurements(
    estimate: float,
    records: Sequence[SpeedRecord],
    *,
    machine: str,
    model: str,
    n_gpu_layers: int,
    n_cpu_moe: int,
    threads: int = 0,
) -> tuple[float, SpeedSource, str]:
    """The speed to show for a placement (and thread count: a record of another count is not this one's
    measurement, only a calibration), where it comes from, and a sentence saying so."""
    mine = [r for r in records if r.machine == machine and r.model == model and r.tokens_per_s > 0]
    same = [
        r
        for r in mine
        if r.n_gpu_layers == n_gpu_layers
        and r.n_cpu_moe == n_cpu_moe
        and r.threads in (0, threads or r.threads)
    ]
    if same:
        latest = same[-1]
        said = f"measured with {latest.tool} on this machine{' on ' + latest.when if latest.when else ''}"
        return latest.tokens_per_s, "measured", said
    ratios = [r.tokens_per_s / r.predicted_tokens_per_s for r in mine if r.predicted_tokens_per_s > 0]
    if ratios:
        ratio = statistics.median(ratios)
        said = (
            f"the estimate x{ratio:.2f}, as measured at {len(ratios)} other placement(s) of this model here"
        )
        return estimate * ratio, "calibrated", said
    return estimate, "estimate", "an estimate, not a measurement"


# -- what verifying a draft costs here (measured by the engine at first load) --------------------------------


@dataclass(frozen=True)
class VerifyCostRecord:
    """A verification cost table measured on this machine (``engine.verify_probe``)."""

    key: str
    """:func:`verify_costs_key` of the machine, model file and placement it was measured at."""
    costs: tuple[float, ...]
    """``costs[m - 1]``: a batch of ``m`` tokens relative to one plain decoding step."""
    step_ms: float
    when: str = ""
    others_busy: float | None = None
    """Cores' worth of CPU other programs used while it was measured; None: measured before the probe looked
    (such a table may be one of stalls, and is measured again)."""


def verify_costs_key(
    machine: Machine,
    quant: str | None,
    file_bytes: int,
    *,
    n_gpu_layers: int,
    n_cpu_moe: int,
    threads: int,
    threads_batch: int,
    copies_state: bool = False,
) -> str:
    """What a verification cost table depends on: the machine, the model file, where its layers run, the
    threads that run one token and a batch, and on a recurrent model whether verifying copies its state first
    (``engine.checkpoints.DraftRollback``: part of every batch's cost; tables measured while llama.cpp's
    snapshots did the rollback have no such mark and are measured again)."""
    return (
        f"{machine_key(machine)}|{model_key(quant, file_bytes)}|ngl={n_gpu_layers},moe={n_cpu_moe},"
        f"t={threads},tb={threads_batch}" + (",rollback=copy" if copies_state else "")
    )


def measured_verify_costs(
    records: Sequence[VerifyCostRecord], key: str, n_max_batch: int
) -> VerifyCostRecord | None:
    """The latest table measured for ``key`` that covers batches of up to ``n_max_batch`` tokens, among those
    measured while the probe looked at the load (``engine.verify_probe`` keeps only quiet ones)."""
    for record in reversed(records):
        if (
            record.key == key
            and record.others_busy is not None
            and len(record.costs) >= n_max_batch
            and record.costs[:1] == (1.0,)
        ):
            return record
    return None
