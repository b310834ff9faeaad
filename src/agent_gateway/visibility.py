"""Which upstreams a client may reach, and so whose words it may read: an upstream's
``instructions`` (in ``initialize`` and the agent's prompt), its log lines sent outside any
call, and its name in ``ask_agent``'s description. An upstream is reachable when the
client's policy lets it see at least one of its tools, prompts or resources.

Worked out once per catalog version and policy (a restricted client's first request after a
change reads the catalog once; an unrestricted one never does).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from agent_gateway.access import Principal
from agent_gateway.catalog import Catalog, CatalogSnapshot

_KEPT = 256


class Visibility:
    """The upstreams each policy reaches, per catalog version."""

    def __init__(self, catalog: Catalog, own_instructions: str | None) -> None:
        self._catalog = catalog
        self._own = own_instructions
        self._known: dict[tuple[int, str], frozenset[str]] = {}

    def upstreams(
        self, client: Principal | None, snapshot: CatalogSnapshot | None = None
    ) -> frozenset[str] | None:
        """The upstreams ``client`` may reach; None: every one (no client, or no restriction)."""
        if client is None or _unrestricted(client):
            return None
        snapshot = snapshot or self._catalog.snapshot
        key = (snapshot.version, client.policy_key)
        if (known := self._known.get(key)) is None:
            if len(self._known) >= _KEPT:
                self._known.clear()
            known = self._known[key] = _reached(snapshot, client)
        return known

    def may_see(self, client: Principal | None, upstream: str) -> bool:
        reached = self.upstreams(client)
        return reached is None or upstream in reached

    def introduced(self, result: Any, client: Principal | None) -> Any:
        """``initialize``'s or ``server/discover``'s ``result`` with the instructions of the
        upstreams ``client`` reaches (FastMCP's are the whole catalog's)."""
        if self.upstreams(client) is None:
            return result
        text = self.instructions(client)
        if isinstance(result, dict):
            updated: dict[str, Any] = {k: v for k, v in result.items() if k != "instructions"}  # pyright: ignore[reportUnknownVariableType]
            if text is not None:
                updated["instructions"] = text
            return updated
        if isinstance(result, BaseModel):
            return result.model_copy(update={"instructions": text})
        return result

    def instructions(self, client: Principal | None) -> str | None:
        """The gateway's instructions followed by those of the upstreams ``client`` reaches."""
        snapshot = self._catalog.snapshot
        reached = self.upstreams(client, snapshot)
        parts = [self._own] if self._own else []
        parts += [
            f"[{name}] {text}"
            for name, text in snapshot.instructions.items()
            if reached is None or name in reached
        ]
        return "\n\n".join(parts) or None


def _unrestricted(client: Principal) -> bool:
    policy = client.policy
    return policy.tools == ("*",) and policy.prompts == ("*",) and policy.resources == ("*",)


def _reached(snapshot: CatalogSnapshot, client: Principal) -> frozenset[str]:
    reached = {p.upstream for p in snapshot.parts.values() if any(client.allows("tool", n) for n in p.tools)}
    reached |= {o.upstream for n, o in snapshot.prompts.items() if client.allows("prompt", n)}
    reached |= {o.upstream for n, o in snapshot.resources.items() if client.allows("resource", n)}
    reached |= {e.origin.upstream for e in snapshot.templates if client.allows("resource", e.prefix + "*")}
    return frozenset(reached)
