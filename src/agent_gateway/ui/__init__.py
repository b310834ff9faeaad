"""The status page at ``GET /``: the gateway's live state for people, in a browser."""

from agent_gateway.ui.routes import status_page

__all__ = ["status_page"]
