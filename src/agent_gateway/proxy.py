"""Forwarding one request to the upstream that owns it: lookup, validation, call."""

from __future__ import annotations

import logging
import time
from typing import Any

import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT

from agent_gateway.catalog import Catalog
from agent_gateway.upstreams import UpstreamPool

logger = logging.getLogger(__name__)


class Proxy:
    """Routes public names to upstreams through the current catalog snapshot."""

    def __init__(self, catalog: Catalog, pool: UpstreamPool) -> None:
        self._catalog = catalog
        self._pool = pool

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, progress: ProgressFnT | None = None
    ) -> types.CallToolResult:
        """Validate and forward a tool call.

        Raises:
            UnknownName, InvalidArguments, UpstreamError
        """
        snapshot = self._catalog.snapshot
        origin = snapshot.tool(name)
        snapshot.validate_arguments(name, arguments)
        started = time.perf_counter()
        try:
            return await self._pool.get(origin.upstream).call_tool(origin.name, arguments, progress=progress)
        finally:
            logger.debug(
                "tools/call %s -> %s (%.1f ms)", name, origin.upstream, (time.perf_counter() - started) * 1e3
            )

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        """Forward a prompt render (raises UnknownName or UpstreamError)."""
        origin = self._catalog.snapshot.prompt(name)
        return await self._pool.get(origin.upstream).get_prompt(origin.name, arguments)

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        """Forward a resource read (raises UnknownName or UpstreamError)."""
        upstream, upstream_uri = self._catalog.snapshot.resource(uri)
        return await self._pool.get(upstream).read_resource(upstream_uri)
