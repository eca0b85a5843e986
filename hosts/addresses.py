"""What an address says about the path to it (pure: no Django; the panel and the host agent
both import it)."""

from __future__ import annotations

import ipaddress


def is_loopback(address: str) -> bool:
    """``address`` names this machine itself (127.0.0.0/8, ::1, localhost): traffic to it never
    crosses a network, so it may go in clear. A DNS name may resolve anywhere, and 0.0.0.0
    means every interface: both count as remote."""
    address = address.strip("[]").lower()
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
