"""What a modern upstream is told, on each request, its client can answer.

The SDK's modern client stamps every request's ``_meta`` with the capabilities the session
declared (its private ``_stamp``, set when the era is adopted). An upstream session shared by
many clients declares everything any of them might answer (``client_side.EVERYTHING``), so
an upstream asked on a client's behalf was told that client could sample, elicit and list
roots whatever it declared: with its input requests passed to a modern client as they are,
it asked that client what it could not answer, where told the truth it takes its fallback.
Wrapped (``told_per_request``), a request that names its own capabilities keeps them;
``tests/test_compat.py`` checks ``_stamp`` is still assigned by the session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp_types import CLIENT_CAPABILITIES_META_KEY

_RELAYED = ("sampling", "elicitation", "roots")
"""What the gateway relays of a client's capabilities (what ``EVERYTHING`` declares)."""


def told_per_request(session: Any) -> None:
    """``session`` (the SDK's ``ClientSession``, its era adopted) sends a request's own
    ``clientCapabilities`` where its ``_meta`` names them, its own declaration elsewhere."""
    stamp: Callable[[dict[str, Any], Any], None] = session._stamp  # pyright: ignore[reportPrivateUsage]

    def stamped(data: dict[str, Any], options: Any) -> None:
        own = ((data.get("params") or {}).get("_meta") or {}).get(CLIENT_CAPABILITIES_META_KEY)
        stamp(data, options)
        if own is not None:
            data["params"]["_meta"][CLIENT_CAPABILITIES_META_KEY] = own

    session._stamp = stamped  # pyright: ignore[reportPrivateUsage]


def told(capabilities: types.ClientCapabilities | None) -> dict[str, Any]:
    """What an upstream is told a client that declared ``capabilities`` can answer through
    the gateway (2 us a request: a modern client's declaration is a new model each time)."""
    if capabilities is None:
        return {}
    dumped = capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {key: dumped[key] for key in _RELAYED if key in dumped}
