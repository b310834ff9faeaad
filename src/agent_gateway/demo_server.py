"""A small notes server, the example gateway.yaml's Python upstream (``python -m agent_gateway.demo_server``)."""

from __future__ import annotations

from collections import deque
from typing import Annotated

from fastmcp import FastMCP
from pydantic import Field

MAX_NOTES = 1000
MAX_NOTE_LENGTH = 4096
# Bounded: every client of the example shares this process, and one client's 40 notes of
# 4 MB made every list of them too large to pass on, for everyone, until a restart.
notes: deque[str] = deque(maxlen=MAX_NOTES)
server = FastMCP(
    "notes",
    instructions=f"Keeps short text notes for the current process (the latest {MAX_NOTES}).",
)


@server.tool
def add_note(text: Annotated[str, Field(max_length=MAX_NOTE_LENGTH)]) -> dict[str, int]:
    """Store a note (at most 4,096 characters; the oldest goes past 1,000 notes); returns its number."""
    notes.append(text)
    return {"number": len(notes)}


@server.tool
def list_notes() -> list[str]:
    """All notes stored so far, oldest first."""
    return list(notes)


@server.tool
def word_count(text: str) -> int:
    """Count the words in a text."""
    return len(text.split())


@server.resource("notes://all", mime_type="text/plain")
def all_notes() -> str:
    """Every note, one per line."""
    return "\n".join(notes)


@server.prompt
def summarize_notes(style: str = "bullet points") -> str:
    """Ask for a summary of the stored notes."""
    return f"Summarize these notes as {style}:\n" + "\n".join(notes)


if __name__ == "__main__":
    server.run(show_banner=False, log_level="WARNING")
