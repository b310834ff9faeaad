"""agent-gateway: one MCP endpoint in front of many upstream MCP servers."""

from agent_gateway.config import GatewayConfig, UpstreamConfig
from agent_gateway.config_files import load_config
from agent_gateway.errors import (
    ConfigError,
    GatewayError,
    InvalidArguments,
    UnknownName,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = [
    "ConfigError",
    "GatewayConfig",
    "GatewayError",
    "InvalidArguments",
    "UnknownName",
    "UpstreamConfig",
    "UpstreamError",
    "UpstreamRejected",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "load_config",
]
__version__ = "0.1.0"
