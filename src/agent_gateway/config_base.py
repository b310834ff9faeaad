"""What every part of the configuration shares: strict frozen models, durations, and the
error a validator raises for a specific field path."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Seconds = Annotated[float, Field(gt=0, le=86_400)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_*?]+$")]
"""An environment variable's name, or a glob over names (``AWS_*``)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def scheme_of(url: str) -> str:
    """What an error may show of a URL: its scheme (the rest can hold credentials)."""
    scheme, found, _ = url.partition("://")
    return f"{scheme}://..." if found else "a url without a scheme"


class FieldProblem(ValueError):
    """A validator's complaint about a specific field path."""

    def __init__(self, path: tuple[str, ...], reason: str) -> None:
        super().__init__(reason)
        self.path = path
        self.reason = reason
