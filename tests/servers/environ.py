"""A stdio upstream that tells what environment its process was given."""

from __future__ import annotations

import os

from fastmcp import FastMCP

server = FastMCP("environ")


@server.tool
def environment() -> dict[str, str]:
    """This process's environment variables."""
    return dict(os.environ)


if __name__ == "__main__":
    server.run(show_banner=False, log_level="WARNING")
