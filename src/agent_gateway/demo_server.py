"""A small notes server, the example gateway.yaml's Python upstream (``python -m agent_gateway.demo_server``)."""

from __future__ import annotations

from fastmcp import FastMCP

notes: list[str] = []
server = FastMCP("notes", instructions="Keeps short text notes for the current process.")


@server.tool
def add_note(text: str) -> dict[str, int]:
    """Store a note; returns its number."""
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
