"""The URL-mode elicitations one upstream session showed its clients (2025-11-25): the id of
the gateway's each client sees for each, and so who the upstream's completion of it is for.

An upstream names a URL elicitation with an id of its own choosing, in an ``elicitation/create``
request or in the data of a -32042 error, and later says it is done
(``notifications/elicitation/complete``). Passed through as they came, ids of different
upstreams met in one client: two upstreams' ``auth-1`` were one id to it, and any upstream
could close another's elicitation by naming its id. Here each client is shown a random id for
each (upstream session, upstream id) asked of it, and a completion goes only to the clients
its upstream session showed that id, under the id each was shown, whatever call is in flight
then (before, to whichever client alone had a call in flight, or to nobody). An id the session
never showed anybody closes nothing.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from agent_gateway.upstreams.client_side import ClientSide

MAX_SHOWN = 64
"""URL elicitations of one upstream session remembered for one client; past it the client's
oldest is forgotten (its completion is then dropped)."""
KEPT = 3600.0
"""Seconds a URL elicitation is remembered for its completion."""
_SWEEP = 60.0
"""Seconds between looks for elicitations past ``KEPT`` (each is checked when completed too)."""


@dataclass(eq=False)
class _Shown:
    id: str
    """The id its client was shown."""
    client: ClientSide
    """Whom it was asked of: a request's caller while that call goes on (told on its stream),
    else a session (``call_ended``)."""
    at: float


class Elicitations:
    """The URL elicitations one upstream session showed, by client session and upstream id."""

    def __init__(self) -> None:
        self.shown_to: dict[str, OrderedDict[bytes, _Shown]] = {}
        """Per client session id, by the upstream's id (hashed: it chose its length), oldest
        first. ``Replies`` looks here as each call ends: a call shown none does nothing more."""
        self._holders: dict[bytes, set[str]] = {}
        """The client sessions shown each upstream id: a completion finds them at once."""
        self._swept = time.monotonic()

    def asked(self, request: types.InputRequest, client: ClientSide) -> types.InputRequest:
        """``request`` as ``client`` is asked it: a URL elicitation under the id shown to it. A
        modern upstream's has none (2026-07-28 dropped it), which a handshake-era client
        requires: it is given one of its own (nothing can complete it)."""
        if not isinstance(request, types.ElicitRequest):
            return request
        params = request.params
        if not isinstance(params, types.ElicitRequestURLParams):
            return request
        if params.elicitation_id is not None:
            shown = self.shown(params.elicitation_id, client)
        elif not client.modern:
            shown = _new_id()
        else:
            return request
        return types.ElicitRequest(params=params.model_copy(update={"elicitation_id": shown}))

    def error_data(self, data: Any, client: ClientSide) -> Any:
        """A -32042 error's ``data`` as ``client`` is shown it: each URL elicitation it lists
        under the id shown to it (an entry of another shape, naming no string id, as it is)."""
        if not isinstance(data, dict) or not isinstance(listed := data.get("elicitations"), list):
            return data
        return {**data, "elicitations": [self._entry(entry, client) for entry in listed]}

    def shown(self, upstream_id: str, client: ClientSide) -> str:
        """The id ``client`` sees for the upstream's ``upstream_id``: the same one each time it
        is shown it again (a call retried and refused again), remembered for ``KEPT`` s."""
        if client.modern:  # never told a completion (2026-07-28 has none): nothing to remember
            return _new_id()
        now = self._now()
        key, session_id = _key(upstream_id), client.session_id
        mine = self.shown_to.setdefault(session_id, OrderedDict())
        if (known := mine.pop(key, None)) is not None and known.at >= now - KEPT:
            known.client, known.at = client, now  # the latest call asked it: told there
        else:
            known = _Shown(_new_id(), client, now)
        mine[key] = known
        self._holders.setdefault(key, set()).add(session_id)
        if len(mine) > MAX_SHOWN:
            self._forget(session_id, next(iter(mine)))
        return known.id

    def completed(self, upstream_id: str) -> list[tuple[str, ClientSide]]:
        """Who was shown the upstream's ``upstream_id``, under which id; forgotten (told once)."""
        now, key, told = self._now(), _key(upstream_id), []
        for session_id in list(self._holders.get(key, ())):
            known = self._forget(session_id, key)
            if known is not None and known.at >= now - KEPT:
                told.append((known.id, known.client))
        return told

    def call_ended(self, caller: ClientSide) -> None:
        """``caller``'s call ended: what it was shown is told through its session from now
        on. The request held, each kept the client's ``_meta`` (64 KiB at most) as long as
        its session: 64 of a session's calls answered -32042, 4 MB (``MAX_SHOWN``)."""
        mine = self.shown_to.get(caller.session_id)
        for known in mine.values() if mine is not None else ():
            if known.client is caller:
                known.client = caller.lasting

    def showed(self, session_id: str) -> bool:
        """Whether client session ``session_id`` was shown any still remembered."""
        return session_id in self.shown_to

    def ended(self, session_id: str) -> None:
        """Client session ``session_id`` ended: its elicitations are forgotten. Kept for
        ``KEPT`` instead, each held its request and session (what it was told through): a
        client opening sessions in a loop, each shown ``MAX_SHOWN``, held them all that long."""
        for key in list(self.shown_to.get(session_id, ())):
            self._forget(session_id, key)

    def _entry(self, entry: Any, client: ClientSide) -> Any:
        if isinstance(entry, dict) and isinstance(upstream_id := entry.get("elicitationId"), str):
            return {**entry, "elicitationId": self.shown(upstream_id, client)}
        return entry

    def _forget(self, session_id: str, key: bytes) -> _Shown | None:
        mine = self.shown_to.get(session_id)
        known = mine.pop(key, None) if mine is not None else None
        if mine is not None and not mine:
            del self.shown_to[session_id]
        if (holders := self._holders.get(key)) is not None:
            holders.discard(session_id)
            if not holders:
                del self._holders[key]
        return known

    def _now(self) -> float:
        """The time, and the elicitations past ``KEPT`` forgotten (every ``_SWEEP`` s at most:
        a completion or a -32042 listing hundreds must not walk every client's each time)."""
        now = time.monotonic()
        if now - self._swept >= _SWEEP:
            self._swept = now
            for session_id, mine in list(self.shown_to.items()):
                while mine and (oldest := next(iter(mine.items())))[1].at < now - KEPT:
                    self._forget(session_id, oldest[0])
        return now


def _new_id() -> str:
    return f"gw-{secrets.token_hex(8)}"


def _key(upstream_id: str) -> bytes:
    return hashlib.blake2b(upstream_id.encode(errors="surrogatepass"), digest_size=16).digest()
