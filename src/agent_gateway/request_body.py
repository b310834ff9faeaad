"""A POST's body, read within its bounds before anything parses it (``limits.py`` decides what
is refused, and answers).

- ``read``: the whole body, or why not: past ``server.max_body_bytes`` (as soon as it passes),
  past the bytes in flight the process may hold, or cut short by the client leaving.
- ``answered_id``: a body past the limit may be a handshake-era client's answer to a question
  the gateway asked it (an ``ask_agent`` run's sampling, an approval, an upstream's elicitation
  relayed to it). Refused unread, the question waited out its own timeout (minutes), then said
  the client did not answer. The answer's id is read from the body's first kilobyte (the SDKs
  write ``jsonrpc`` and ``id`` before the result), so the question can fail at once, saying why.
  That kilobyte is read across however many chunks it comes in (a client whose first chunk held
  ten bytes had its question wait out its timeout), within the body's own deadline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

import anyio
from mcp_types import RequestId
from starlette.types import Message, Receive, Scope, Send

from agent_gateway.errors import GatewayBusy
from agent_gateway.in_flight import UNCOUNTED, BodyHeld

HEAD_BYTES = 1024
"""How much of a body past the limit is kept, to find the id of the answer it may be."""

GONE = b"\x00gone"
"""A body cut short by a disconnect (compared by identity)."""

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_KEY = re.compile(rb"\s*:")
_ID = re.compile(rb'\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,256}")\s*[,}]')
_ANSWERS = frozenset({b'"result"', b'"error"'})


@dataclass(frozen=True)
class Oversized:
    """A body past the limit: its first bytes (at most ``HEAD_BYTES``; none read when its
    declared length was refused unread) and its declared size, if any."""

    head: bytes
    size: int | None = None


async def read(receive: Receive, held: BodyHeld, limit: int) -> bytes | GatewayBusy | Oversized:
    """The whole body; ``Oversized`` as soon as it passes ``limit``; the error as soon as it
    does not fit the bytes in flight (``held``); ``GONE`` if the client left."""
    size, chunks = 0, list[bytes]()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return GONE
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return Oversized(_first_bytes([*chunks, chunk]))
        if size > UNCOUNTED and (busy := held.take(size - held.size)) is not None:
            return busy
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def head(receive: Receive, deadline: float) -> bytes:
    """The first ``HEAD_BYTES`` of a body not otherwise read, over as many chunks as they come
    in; what came by ``deadline`` (or before the body ended, or the client left)."""
    kept = bytearray()
    with anyio.CancelScope(deadline=deadline):
        while len(kept) < HEAD_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                break
            kept += message.get("body", b"")[: HEAD_BYTES - len(kept)]
            if not message.get("more_body", False):
                break
    return bytes(kept)


def _first_bytes(chunks: Iterable[bytes]) -> bytes:
    """The first ``HEAD_BYTES`` of ``chunks`` joined (without joining the rest)."""
    kept = bytearray()
    for chunk in chunks:
        kept += chunk[: HEAD_BYTES - len(kept)]
        if len(kept) >= HEAD_BYTES:
            break
    return bytes(kept)


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def answered_id(head: bytes) -> RequestId | None:
    """The id of the JSON-RPC answer (a result or an error) ``head`` begins; None when it is no
    answer (a request has a ``method``) or its id is not within it. Only the object's own keys
    count, not those of what it holds."""
    keys, found = _keys_and_id(head)
    if found is None or b'"method"' in keys or not keys & _ANSWERS:
        return None
    return found


def requested_id(head: bytes) -> RequestId | None:
    """The id of the JSON-RPC request ``head`` begins (as ``answered_id`` reads one), for a
    refusal's answer to carry (JSON-RPC 2.0: null only when it cannot be told); None when it
    is no request or its id is not within it."""
    keys, found = _keys_and_id(head[:HEAD_BYTES])
    if found is None or b'"method"' not in keys or keys & _ANSWERS:
        return None
    return found


def _keys_and_id(head: bytes) -> tuple[set[bytes], RequestId | None]:
    """The keys of the object ``head`` begins (as far as it goes) and its id, if read."""
    if not head.lstrip().startswith(b"{"):
        return set(), None
    depth, keys, found = 0, set[bytes](), None
    for token in _TOKEN.finditer(head):
        text = token.group()
        if text in (b"{", b"["):
            depth += 1
        elif text in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and _KEY.match(head, token.end()):
            keys.add(text)
            if text == b'"id"' and (value := _ID.match(head, token.end())) is not None:
                try:  # a bad escape, a leading zero: matched, yet no JSON (it was a 500 and a traceback)
                    found = json.loads(value.group(1))
                except ValueError:
                    found = None
    return keys, found


async def bodiless(scope: Scope, receive: Receive, deadline: float) -> Receive | None:
    """``receive`` for a request other than a POST, which carries no body; None when one
    follows: a ``Content-Length`` past 0, or a chunked body with any bytes in it (or not ended
    by ``deadline``). An empty chunked body is no body: a client library given an empty
    stream for a DELETE sends its last chunk alone (httpx, given an empty iterator)."""
    if (content_length(scope) or 0) > 0:
        return None
    if not any(name == b"transfer-encoding" for name, _ in scope["headers"]):
        return receive
    with anyio.CancelScope(deadline=deadline):
        message = await receive()
        if message["type"] == "http.request" and not message.get("body") and not message.get("more_body"):
            return replay(b"", receive)
    return None


DRAIN_BYTES = 4 * 2**20
"""The largest body read and dropped before a 401 (``server.max_body_bytes``' ceiling)."""
DRAIN_WITHIN = 2.0
"""Seconds such a body is given to arrive."""


async def unread(scope: Scope, receive: Receive, send: Send) -> Send:
    """``send`` for the answer (a 401) to a request whose body is not for the app, once that
    body is dealt with. A body of a declared ``Content-Length`` up to ``DRAIN_BYTES`` is read
    and dropped first, ``DRAIN_WITHIN`` at most: answered and closed while its client still
    sent it, the connection was reset under the client's unread bytes, and a client whose token
    had expired never read the 401 that says so (an 8 MiB POST on loopback; over a network, far
    less). Any other body (chunked, larger, or later): answered at once and the connection
    closed (the ``send`` returned adds the header), which was otherwise kept for the rest of
    the body until the next head's deadline (a trickle held it, and its descriptor). The
    caller answers in its turn, after: the drain is its client's time, no work of the
    gateway's (within the turn, an address's trickles held its /healthz up 5 s)."""
    declared = content_length(scope) or 0
    chunked = any(name == b"transfer-encoding" for name, _ in scope["headers"])
    if not chunked and (not declared or (declared <= DRAIN_BYTES and await _drained(receive))):
        return send

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return closing


async def _drained(receive: Receive) -> bool:
    """Whether the body was read to its end within ``DRAIN_WITHIN`` (dropped as it came)."""
    with anyio.move_on_after(DRAIN_WITHIN):
        while (message := await receive())["type"] == "http.request":
            if not message.get("more_body", False):
                return True
    return False


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an app after ``body`` was read whole: the body, then what comes after."""
    delivered = False

    async def replayed() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # afterwards only a disconnect can come

    return replayed
