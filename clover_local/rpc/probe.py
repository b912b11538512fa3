"""Read what each ``--rpc`` worker lends (devices, free memory) and measure the link to it, through the RPC
protocol itself: nothing to install on the worker beyond ``rpc-server``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from clover_local.detect.remote import Link, Worker, WorkerSpec, number_devices, parse_link, parse_rpc
from clover_local.rpc.protocol import DEFAULT_TIMEOUT_S, WorkerReport, probe_worker


def probe_workers(
    rpc: str, *, link: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[Worker, ...]:
    """The workers ``--rpc`` names, probed in parallel; ``link`` (``--link``) replaces the measured network.
    Raises ``RpcError`` (a ``CloverError``) naming the worker that cannot be read."""
    specs = parse_rpc(rpc)
    given = parse_link(link) if link else None
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        reports = list(
            pool.map(
                lambda s: probe_worker(s.host, s.port, measure=given is None, timeout_s=timeout_s), specs
            )
        )
    return workers_from_reports(specs, reports, given)


def workers_from_reports(
    specs: tuple[WorkerSpec, ...], reports: list[WorkerReport], given: Link | None
) -> tuple[Worker, ...]:
    """Probe answers as :class:`Worker` values, devices named as llama.cpp will name them."""
    links: dict[str, Link] = {}
    for spec, report in zip(specs, reports, strict=True):
        if given is not None:
            links[spec.endpoint] = given
        elif report.link is not None:
            m = report.link
            links[spec.endpoint] = Link(
                min(m.send_bytes_per_s, m.recv_bytes_per_s),
                m.rtt_s,
                f"measured: {m.send_bytes_per_s / 1e6:.0f} MB/s to, {m.recv_bytes_per_s / 1e6:.0f} MB/s from the "
                f"worker, {m.rtt_s * 1e3:.2f} ms round trip",
            )
    devices = [
        [(s.kind, d.free_bytes, d.total_bytes) for d in r.devices]
        for s, r in zip(specs, reports, strict=True)
    ]
    return number_devices(list(zip(specs, devices, strict=True)), links, "probed")
