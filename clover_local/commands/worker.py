"""``clover-local worker``: lend this machine's devices to another machine's llama-server (llama.cpp RPC)."""

from __future__ import annotations

import argparse
import signal
import sys

from clover_local.detect.remote import DEFAULT_PORT
from clover_local.detect.units import format_bytes

SECURITY_WARNING = (
    "WARNING: llama.cpp's RPC protocol has no authentication and no encryption. Anyone who can reach {endpoint} "
    "can use this machine's devices and memory, see what passes through them (the activations of your prompts "
    "and replies), and may crash the worker. Run it only on a network you trust, never where the internet can "
    "reach it; a firewall rule that lets in only the main machine is wise."
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "worker",
        help="lend this machine's GPU (or CPU) to another machine's clover-local over the network (RPC)",
        description=(
            "Start llama.cpp's rpc-server so the main machine can place layers on this machine's devices "
            "(`clover-local serve --rpc HOST:PORT` there). RPC has no authentication or encryption: bind to the "
            "address of a network you trust. Listens on 127.0.0.1 (this machine only); another --host needs "
            "--trust-network. Ctrl-C stops it."
        ),
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on: this machine's LAN address (default 127.0.0.1: reachable from this machine "
        "only; 0.0.0.0 = every network interface, only when you say so)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    parser.add_argument(
        "--device",
        metavar="DEV1,DEV2",
        help="devices to lend, as llama.cpp names them (CUDA0, Vulkan1, CPU...; default: every GPU, else the CPU)",
    )
    from clover_local.commands.options import add_threads_option

    add_threads_option(parser, "CPU threads when lending the CPU")
    parser.add_argument(
        "--cache", action="store_true", help="keep large weights in a local file cache (faster reloads)"
    )
    parser.add_argument(
        "--trust-network",
        action="store_true",
        help="allow a --host other than loopback: say so only for a network you trust (RPC has no authentication)",
    )
    parser.add_argument("--verbose", action="store_true", help="print rpc-server's log")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.llamacpp.rpc_server import check_worker_host, lan_addresses, rpc_spec, start_worker
    from clover_local.netaddr import is_loopback_host

    host = args.host.strip()
    endpoint = f"{host}:{args.port}"
    loopback = is_loopback_host(host)
    check_worker_host(host, args.trust_network)
    if host not in ("127.0.0.1", "localhost"):  # any other address, loopback or not, is a deliberate choice
        print(SECURITY_WARNING.format(endpoint=endpoint), file=sys.stderr)
        if host in ("0.0.0.0", ""):
            print(
                "WARNING: --host 0.0.0.0 listens on every network interface of this machine, public ones "
                "included.",
                file=sys.stderr,
            )
    # Ctrl-C (SIGINT) stops the worker however it was started: a process started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Python then installs no handler of its own (serve's
    # uvicorn installs one itself).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    on_log = (lambda line: print(f"[rpc-server] {line}", file=sys.stderr)) if args.verbose else None
    worker = start_worker(
        host,
        args.port,
        devices=args.device,
        threads=args.threads,
        cache=args.cache,
        on_log=on_log,
        trust_network=args.trust_network,
    )
    try:
        for d in worker.devices:
            print(
                f"lending {d.name}: {d.description}, {format_bytes(d.free_mib * 2**20)} free of "
                f"{format_bytes(d.total_mib * 2**20)}",
                file=sys.stderr,
            )
        addresses = [host]
        if loopback:
            lan = lan_addresses() or ["ADDRESS"]
            print(
                f"worker on {endpoint}: reachable from this machine only (for tests). To lend it to another "
                "machine, name this machine's address on your network: "
                + ", ".join(f"clover-local worker --host {a}" for a in lan),
                file=sys.stderr,
            )
        elif host in ("0.0.0.0", ""):
            addresses = lan_addresses() or ["ADDRESS"]
        for address in addresses:
            print(
                f"On the main machine: clover-local serve --rpc {rpc_spec(worker.devices, address, args.port)}"
            )
        print("Ctrl-C stops the worker.", file=sys.stderr)
        sys.stdout.flush()
        code = worker.wait()
        print(f"rpc-server exited (code {code}). Its last lines:\n{worker.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        worker.stop()
        print("worker stopped", file=sys.stderr)
        return 0
    finally:
        worker.stop()
