"""Which client addresses count as one client: what anonymous clients and connections from
one address are counted by.

An IPv4 address is one client, and so is an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``: the
same client seen by a dual-stack listener). An IPv6 address is counted by its /64: a host or
a site is given a whole /64 and may use any of its 2^64 addresses, so keyed by address each
bound per client (rate, sessions, connections) would be one per address it chose.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache


@lru_cache(maxsize=4096)
def client_key(address: str) -> str:
    """The key of the client at ``address`` (anything not an IP address is its own key)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, 64), strict=False))
