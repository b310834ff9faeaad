"""Assembling the gateway from configuration: upstream pool, catalog, proxy, FastMCP server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import mcp_types as types
from fastmcp import FastMCP

from agent_gateway.catalog import Catalog, CatalogSnapshot
from agent_gateway.components import CatalogProvider
from agent_gateway.config import GatewayConfig
from agent_gateway.errors import ConfigError
from agent_gateway.notifier import ListChangedNotifier
from agent_gateway.proxy import Proxy
from agent_gateway.upstreams import UpstreamPool

logger = logging.getLogger(__name__)


class Gateway:
    """Everything one running gateway owns. Use ``async with gateway.running():``."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.catalog = Catalog(config)
        self.pool = UpstreamPool(config.active_upstreams, self.catalog.update)
        self.proxy = Proxy(self.catalog, self.pool)
        self.notifier = ListChangedNotifier()
        self.catalog.subscribe(self.notifier.notify)
        self.server = FastMCP(
            config.server.name,
            instructions=config.server.instructions,
            providers=[CatalogProvider(self.catalog, self.proxy)],
            middleware=[self.notifier],
        )
        # FastMCP does not serve subscriptions/listen; modern clients learn of changes there.
        self.server._mcp_server.add_request_handler(  # pyright: ignore[reportPrivateUsage]
            "subscriptions/listen", types.SubscriptionsListenRequestParams, self.notifier.listen_handler
        )

    @asynccontextmanager
    async def running(self, *, settle_timeout: float | None = None) -> AsyncIterator[Gateway]:
        """Connect the upstreams and build the catalog; stop everything on exit.

        Raises:
            ConfigError: two upstreams produce the same public name at start-up.
        """
        refused: ConfigError | None = None
        async with self.pool.running(settle_timeout=settle_timeout):
            try:
                snapshot = self.catalog.start()
            except ConfigError as exc:
                refused = exc  # raised below, once the pool is closed, not inside its task group
            else:
                self.server.instructions = _instructions(self.config.server.instructions, snapshot)
                _log_start(self, snapshot)
                try:
                    yield self
                finally:
                    self.notifier.listen_handler.close()
        if refused is not None:
            raise refused


def _instructions(own: str | None, snapshot: CatalogSnapshot) -> str | None:
    parts = [own] if own else []
    parts += [f"[{name}] {text}" for name, text in snapshot.instructions.items()]
    return "\n\n".join(parts) or None


def _log_start(gateway: Gateway, snapshot: CatalogSnapshot) -> None:
    for status in gateway.pool.statuses():
        if status.last_error:
            logger.warning(
                "upstream %s unavailable at start-up: %s (retrying)", status.name, status.last_error
            )
    logger.info(
        "catalog ready: %d tools, %d prompts, %d resources, %d templates from %d upstreams",
        len(snapshot.tools),
        len(snapshot.prompts),
        len(snapshot.resources),
        len(snapshot.templates),
        len(gateway.pool.upstreams),
    )
