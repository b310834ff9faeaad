"""Upstream MCP servers: one connection each, its life, and the pool that holds them all."""

from agent_gateway.upstreams.connection import Upstream, UpstreamState
from agent_gateway.upstreams.pool import UpstreamPool

__all__ = ["Upstream", "UpstreamPool", "UpstreamState"]
