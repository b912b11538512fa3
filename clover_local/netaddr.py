"""Which listening addresses reach this machine only: one decision for the API server (its Host check and
its no-key warning) and the RPC worker (which refuses anything else unless the network is trusted)."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only: ``localhost``, 127.0.0.0/8, ``::1`` (bracketed
    or not). ``0.0.0.0``, ``::`` and every other address reach the network."""
    host = host.strip().lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
