"""``httpx2``'s internals the gateway uses (verified against httpx2 2.17): its reading of
the proxy environment variables, so the aiohttp transport honours them exactly as the
SDK's own httpx2 client would."""

from __future__ import annotations

from httpx2._utils import URLPattern, get_environment_proxies

__all__ = ["URLPattern", "get_environment_proxies"]
