"""The example's notes server is shared by every client of the example gateway: what one
client stores is bounded (40 notes of 4 MB made every list too large to pass on, for
everyone, until a restart; found by a helper's attack, stop 51)."""

from __future__ import annotations

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

from agent_gateway import demo_server


async def test_a_note_is_bounded_in_length_and_the_notes_in_number() -> None:
    demo_server.notes.clear()
    async with Client(demo_server.server) as client:
        with pytest.raises(ToolError, match="4096"):
            await client.call_tool("add_note", {"text": "x" * (demo_server.MAX_NOTE_LENGTH + 1)})
        for n in range(demo_server.MAX_NOTES + 5):
            await client.call_tool("add_note", {"text": f"note {n}"})
        listed = (await client.call_tool("list_notes", {})).structured_content
    assert listed is not None
    kept = listed["result"]
    assert len(kept) == demo_server.MAX_NOTES
    assert kept[0] == "note 5"  # the oldest went
    assert kept[-1] == f"note {demo_server.MAX_NOTES + 4}"
