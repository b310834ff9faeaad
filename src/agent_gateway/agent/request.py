"""What one ``ask_agent`` call asks for: plain data, importable without the agent's libraries."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AgentRequest:
    """The arguments of one ``ask_agent`` call."""

    query: str
    conversation_id: str | None = None
    context: Mapping[str, Any] | None = None

    @property
    def text(self) -> str:
        if not self.context:
            return self.query
        return f"{self.query}\n\nContext (JSON): {json.dumps(self.context, ensure_ascii=False, default=str)}"
