"""What admission answers a client it refuses for its limits: its rate, its sessions (counted
here or, with a shared store, across replicas), this replica's bound of sessions. Each is
counted and logged (``refusals.py``) and carries the HTTP headers that say when to retry."""

from __future__ import annotations

import json

from mcp_types import RequestId
from starlette.types import Send

from agent_gateway.access import Principal
from agent_gateway.errors import GatewayBusy, GatewayError, RateLimited, to_wire
from agent_gateway.refusals import refused
from agent_gateway.store.limits import Verdict, retry_after

Refusal = tuple[RateLimited, list[tuple[bytes, bytes]]]
"""Why a request is refused, and the HTTP headers that say when to retry."""


def verdict_refusal(client: Principal, verdict: Verdict) -> Refusal | None:
    """The shared limits' refusal (counted once across replicas), or None."""
    if verdict.refused == "rate_limit":
        return rate_refusal(client, verdict.wait)
    if verdict.refused == "sessions":
        return sessions_refusal(client, verdict.open)
    return None


def rate_refusal(client: Principal, wait: float) -> Refusal:
    refused("rate_limit", "client %s over its rate limit", client.label, peer=client.label)
    limited = RateLimited.retry_in(client.subject, wait)
    return limited, [(b"retry-after", str(retry_after(wait)).encode())]


def sessions_refusal(client: Principal, open_now: int) -> Refusal:
    limit = client.policy.max_sessions
    refused(
        "sessions",
        "client %s refused a new session: %d open, the limit is %d",
        client.label,
        open_now,
        limit,
        peer=client.label,
    )
    message = f"client {client.subject!r} has {limit} sessions open, the limit (max_sessions); end one (DELETE) or reuse it"
    return RateLimited(message), []


def bound_refusal(max_sessions: int) -> tuple[GatewayBusy, list[tuple[bytes, bytes]]]:
    """This replica holds ``max_sessions`` sessions and none can end for a new one."""
    busy = GatewayBusy(
        f"the gateway holds {max_sessions} sessions (server.max_sessions), "
        "none of which can end for a new one; retry later"
    )
    return busy, [(b"retry-after", b"1")]


async def refuse(
    send: Send,
    status: int,
    refusal: GatewayError,
    headers: list[tuple[bytes, bytes]] | None = None,
    request_id: RequestId | None = None,
) -> None:
    """``refusal`` as the JSON-RPC error ``errors.to_wire`` makes of it, in an HTTP answer of
    ``status``; its id the request's as read from the body's first bytes
    (``request_body.requested_id``), null when it could not be (the body is never parsed)."""
    error = to_wire(refusal).error.model_dump(mode="json", exclude_none=True)
    encoded = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(encoded)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": encoded})


async def unanswered(send: Send, session: str | None) -> None:
    """A request its client cancelled before it was served, ended as the SDK's handshake-era
    transport ends one: a stream with no event on it."""
    headers = [(b"content-type", b"text/event-stream"), (b"mcp-session-id", (session or "").encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
