"""The network's share of a token when layers live on other machines (llama.cpp's RPC backend).

Decoding one token walks the layers in order. Each time the computation moves between this machine and a
worker, the boundary's tensor crosses the network: the residual stream (``n_embd`` f32 values) plus the small
inputs a worker's part of the graph needs (positions, the attention mask over the cached tokens). Sending is
asynchronous, but this machine waits for every result coming back: one round trip each time the computation
returns from a worker. Two workers in a row exchange through this machine (``ggml_backend_tensor_copy`` reads
from one and writes to the other). When the output head is on a worker, the logits (``n_vocab`` f32 values)
come back every token. Layers whose experts stay in RAM (``--n-cpu-moe``) bounce to this machine and back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clover_local.detect.remote import Link
from clover_local.presets import Architecture

F32 = 4
MASK_BYTES_PER_CELL = 2
"""The KQ mask is f16, one value per cached token for the token being decoded."""


def network_cost_per_token(
    arch: Architecture,
    devices: Sequence[int],
    n_cpu_moe: int,
    endpoints: Sequence[str | None],
    links: Mapping[str, Link],
    ctx_used: int,
) -> tuple[float, int, int, int]:
    """(seconds, bytes, transfers, round trips) per decoded token.

    ``devices``: the device of each layer then the output head (``memory.Placement.devices``: a pooled device
    index, -1 for this machine's CPU); ``endpoints[i]``: the worker of pooled device ``i``, None for a local GPU.
    """
    n = arch.n_layers
    where: list[str | None] = [None]  # the token embedding is looked up on this machine's CPU
    for il in range(n):
        d = devices[il]
        here = endpoints[d] if d >= 0 else None
        where.append(here)
        if d >= 0 and il < n_cpu_moe and arch.is_moe:
            where += [None, here]  # routed experts in this machine's RAM, then back for the residual add
    where.append(endpoints[devices[n]] if devices[n] >= 0 else None)
    where.append(None)  # the logits end on this machine
    activation = arch.n_embd * F32
    inputs = 4 + (MASK_BYTES_PER_CELL * ctx_used if arch.attention_layers else 0)
    seconds, n_bytes, transfers, trips = 0.0, 0, 0, 0

    def move(endpoint: str, size: int) -> None:
        nonlocal seconds, n_bytes, transfers
        seconds += size / links[endpoint].bandwidth_bytes_per_s
        n_bytes += size
        transfers += 1

    last = len(where) - 1
    for i in range(1, len(where)):
        a, b = where[i - 1], where[i]
        if a == b:
            continue
        size = arch.n_vocab * F32 if i == last else activation
        if a is not None:  # coming back from a worker: wait for it, then read the result
            seconds += links[a].rtt_s
            trips += 1
            move(a, size)
        if b is not None:
            move(b, size + inputs)
    return seconds, n_bytes, transfers, trips


def describe_links(links: Mapping[str, Link]) -> tuple[str, ...]:
    return tuple(
        f"{endpoint}: {link.bandwidth_bytes_per_s / 1e6:.0f} MB/s, {link.rtt_s * 1e3:.2f} ms round trip ({link.source})"
        for endpoint, link in links.items()
    )
