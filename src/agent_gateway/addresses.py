"""Which client addresses count as one client: what anonymous clients and connections from
one address are counted by.

An IPv4 address is one client, and so is an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``: the
same client seen by a dual-stack listener) or one translated by NAT64 (``64:ff9b::/96``). An
IPv6 address is counted by its /64: a host or a site is given a whole /64 and may use any of
its 2^64 addresses, so keyed by address each bound per client (rate, sessions, connections)
would be one per address it chose. A link-local address (``fe80::/64``, every host on the link
in the same /64) is its own client.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""IPv4 clients translated to IPv6 (RFC 6052's well-known prefix), each its IPv4 in the low bits."""


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
    if ip in _NAT64:
        return str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.is_link_local:
        return address
    return str(ipaddress.IPv6Network((ip, 64), strict=False))
