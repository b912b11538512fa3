"""What a speculative verification batch costs, relative to decoding one token: a fixed model, not a timing.

Drafting decisions must not depend on wall-clock timings: llama.cpp does not evaluate a batch bit-for-bit like
one token at a time, so a drafter that drafts more when the machine is idle and less when it is busy gives
different greedy text under different load. The cost of verifying ``m`` tokens in one batch is therefore
modelled from the model and the backend, once, when the plan is made:

- **memory**: a decode step reads every active weight once. Dense weights are read once per batch whatever
  ``m``; routed experts are read once per *distinct* expert the batch routes to. With ``k`` of ``E`` experts per
  token chosen at random, ``m`` tokens touch ``E * (1 - (1 - k/E) ** m)`` experts on average, so on a MoE model
  (Clover: 8 of 256) a batch of 8 reads ~7.5x the expert bytes of one token.
- **compute**: each extra token adds ``slope`` of a one-token step: small on a GPU (a decode step there is bound
  by memory and kernel launches), 0.4 on a CPU. On a CPU any batch of two or more also pays a fixed ``step``:
  llama.cpp multiplies a batch with other kernels than one token (matrix-matrix instead of matrix-vector,
  logits for every row), so a batch of 2 already costs about 1.8 (two threads) to 2.3 (one thread) steps
  (``benchmarks/bench_verify_batch.py``, Gemma 3 270M): drafting one or two tokens there loses even when they are
  right, and only longer drafts pay.

``costs[m - 1]`` is the relative cost of a batch of ``m`` tokens (``costs[0] == 1``).
"""

from __future__ import annotations

from collections.abc import Sequence

CPU_SLOPE = 0.4
"""Extra cost of each further token in a batch on a CPU, relative to a one-token step: 0.2-0.3 measured with 2
decode threads, more with 1 (plans leave a core free, so a 2-core machine decodes on one); at 0.25 free chat on
one thread ran 0.81x plain, drafting where it did not pay."""
CPU_BATCH_STEP = 0.6
"""Fixed extra cost of any batch of two or more tokens on a CPU, relative to a one-token step: 0.4 measured
with two threads, 0.9 with one (``benchmarks/bench_verify_batch.py``: batches of 2/5/9/17 cost 2.3/4.0/5.2/8.3
steps on one thread)."""
GPU_SLOPE = 0.03
"""The same on a GPU backend, where one-token decoding leaves the compute units mostly idle."""


def distinct_experts(n_expert: int, n_used: int, m: int) -> float:
    """Expected number of distinct experts ``m`` tokens route to, ``n_used`` of ``n_expert`` each."""
    if n_expert <= 0 or n_used <= 0:
        return 0.0
    return n_expert * (1.0 - (1.0 - n_used / n_expert) ** m)


def batch_costs(
    *,
    n_max_batch: int,
    on_gpu: bool,
    dense_bytes: float = 1.0,
    expert_bytes: float = 0.0,
    n_expert: int = 0,
    n_expert_used: int = 0,
) -> tuple[float, ...]:
    """Relative cost of evaluating 1..``n_max_batch`` tokens in one batch.

    ``dense_bytes``: bytes read once per step whatever the batch (attention or recurrent weights, shared
    expert, output head); ``expert_bytes``: routed-expert bytes one token reads (``n_expert_used`` experts).
    """
    slope = GPU_SLOPE if on_gpu else CPU_SLOPE
    step = 0.0 if on_gpu else CPU_BATCH_STEP
    one = dense_bytes + expert_bytes
    out: list[float] = []
    for m in range(1, max(1, n_max_batch) + 1):
        if expert_bytes > 0 and n_expert_used > 0 and one > 0:
            per_expert = expert_bytes / n_expert_used
            memory = (dense_bytes + per_expert * distinct_experts(n_expert, n_expert_used, m)) / one
        else:
            memory = 1.0
        out.append(round(memory + (step if m > 1 else 0.0) + slope * (m - 1), 4))
    return tuple(out)


def cost_of(costs: Sequence[float], m: int, *, default_slope: float = CPU_SLOPE) -> float:
    """Cost of a batch of ``m`` tokens from a cost table, extrapolated linearly past its end."""
    if m <= 0:
        return 0.0
    if not costs:
        return 1.0 + (CPU_BATCH_STEP if m > 1 else 0.0) + default_slope * (m - 1)
    if m <= len(costs):
        return costs[m - 1]
    last = costs[-1]
    step = costs[-1] - costs[-2] if len(costs) >= 2 else default_slope
    return last + step * (m - len(costs))
