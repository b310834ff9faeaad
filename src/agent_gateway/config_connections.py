"""The HTTP listener's bounds on client connections (``server.connections``)."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator

from agent_gateway.config_base import Seconds
from agent_gateway.config_base import Strict as _Strict


class ConnectionsConfig(_Strict):
    """Bounds on the HTTP listener's connections, before any request is read."""

    max: int | None = Field(default=None, ge=16, le=1_000_000)
    """Client connections open at once; None: what the open-file limit leaves after the
    gateway's own needs (``RLIMIT_NOFILE``, raised to its hard limit), at most 10,000."""
    per_address: int = Field(default=512, ge=1, le=1_000_000)
    """Connections from one client address (behind a proxy, all clients share its address)."""
    header_timeout: Seconds = 10.0
    """A connection must send a whole request head within this, when it opens and after
    each response; otherwise it is closed."""
    keep_alive_timeout: int = Field(default=5, ge=1, le=3600)
    """An idle keep-alive connection is closed after this many seconds."""
    body_timeout: Seconds = 30.0
    """A request body must have arrived within this; otherwise 408."""
    max_head_bytes: int = Field(default=64 * 1024, ge=1024, le=2**20)
    """Bytes of one request head (request line and headers); past it 431, closed."""
    max_headers: int = Field(default=200, ge=8, le=10_000)
    """Header lines in one request head; past it 431, closed."""
    write_timeout: Seconds = 30.0
    """Once a connection's write buffer is full, its client must read some of it within
    this; otherwise the connection is dropped (and what it held is let go)."""
    min_read_rate: int = Field(default=4096, ge=0, le=2**30)
    """Bytes a second such a client must read, on average over each ``write_timeout`` (or
    half of what was waiting, if less); 0: any byte read counts."""
    trusted_proxies: tuple[str, ...] = ()
    """Addresses or networks (``10.0.0.0/8``) of the proxies in front of the gateway (a load
    balancer): a request arriving from one is taken to come from the address its
    ``X-Forwarded-For`` names (the last one not itself a trusted proxy), which is then the
    client's address for everything keyed by it (an anonymous client's identity, its limits).
    Empty: the header is ignored. uvicorn's own default trusts loopback, so any local process
    could name its own address, and with it become as many anonymous clients as it liked."""

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            try:
                ipaddress.ip_network(value)
            except ValueError:
                raise ValueError(f"trusted_proxies: {value!r} is not an IP address or network") from None
        return values
