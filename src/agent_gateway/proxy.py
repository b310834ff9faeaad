"""Routing one request to the upstream session that owns its public name: resolved once in
the catalog snapshot, authorized once from the identity on its ``Caller``, sent with the
caller's relays (``downstream.caller``) for what the upstream sends back during it, as a call
of its client (its label), which holds at most its share of the upstream's slots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from contextlib import AbstractAsyncContextManager, nullcontext, suppress
from functools import partial
from typing import Any, Literal, TypeVar

import anyio
import mcp_types as types

from agent_gateway.access import Principal
from agent_gateway.catalog import Catalog, CatalogSnapshot
from agent_gateway.downstream.caller import Caller
from agent_gateway.downstream.held_calls import HeldCalls
from agent_gateway.downstream.held_rounds import ToolResult
from agent_gateway.downstream.sessions import LEVELS, DownstreamSession, standing
from agent_gateway.errors import GatewayError, NotAllowed, UnknownName, UnmatchedURI, UpstreamAnswered
from agent_gateway.logs import NO_IDENTITY_REFUSED, UNSEEN_REFUSED
from agent_gateway.meta_keys import RESULT_DROPPED
from agent_gateway.refusals import refused
from agent_gateway.resource_links import linked_prompt, linked_result, public_contents
from agent_gateway.runtime import SEND_TIMEOUT
from agent_gateway.upstreams import UpstreamPool
from agent_gateway.upstreams.dedicated import DedicatedSessions
from agent_gateway.upstreams.session import UpstreamSession

logger = logging.getLogger(__name__)


def _identity(caller: Caller | None, client: Principal | None, kind: str, name: str) -> Principal:
    """The client a request is forwarded for; fail closed: without one, nothing is."""
    who = client if client is not None else (caller.client if caller is not None else None)
    if who is None:
        logger.warning(NO_IDENTITY_REFUSED, kind, name)
        raise NotAllowed(kind, name, "(no identity)")
    return who


def _unseen(
    who: Principal | None,
    kind: Literal["prompt", "resource"],
    name: str,
    shown_as: str | None = None,
    public: str | None = None,
) -> Principal:
    """``who``, which may reach ``name`` (its policy matched against ``public``, else
    ``name``). Raises ``UnknownName`` when it may not: the answer a name that does not exist
    gets, so a client cannot probe which hidden names exist."""
    if who is None or not who.allows(kind, public or name):
        subject = who.label if who is not None else "(no identity)"
        logger.warning(UNSEEN_REFUSED, subject, kind, name, extra={"peer": subject})
        raise UnknownName(shown_as or kind, name)
    return who


def _turn(
    session: UpstreamSession, who: Principal, tool: str | None = None
) -> AbstractAsyncContextManager[None]:
    """A client's request sent in its turn at its upstream (``upstreams/queueing.py``), on a
    shared session or a dedicated one alike."""
    if session.queue is None:
        return _AT_ONCE
    config = session.config
    return session.queue.turn(
        who.label, lambda: config.timeout_of(tool) if tool is not None else config.timeout, session
    )


_AT_ONCE = nullcontext()


R = TypeVar("R", bound=types.Result)


def _relayed(result: R) -> R:
    """An upstream's result as the gateway's: the ``_meta`` keys that describe the upstream
    itself (its serverInfo, its protocol version) are dropped; the rest pass through."""
    meta = result.meta
    if not meta or RESULT_DROPPED.isdisjoint(meta):
        return result
    kept = {key: value for key, value in meta.items() if key not in RESULT_DROPPED}
    return result.model_copy(update={"meta": kept or None})


def _linked(result: ToolResult, upstream: str, catalog: Catalog) -> ToolResult:
    """A tool's result relayed, its resource links under public URIs (``resource_links``)."""
    if isinstance(result, types.CallToolResult):
        return linked_result(_relayed(result), upstream, catalog.snapshot)
    return _relayed(result)


def _named_as_read(refusal: UpstreamAnswered, upstream_uri: str, uri: str) -> None:
    """An upstream's refusal of a read names, in its data (``{"uri": …}``, as the SDK's and
    FastMCP's do), the URI the client read, not the upstream's (another's or nobody's)."""
    if uri != upstream_uri and isinstance(refusal.data, dict) and refusal.data.get("uri") == upstream_uri:
        refusal.data = {**refusal.data, "uri": uri}


def _routed(snapshot: CatalogSnapshot, uri: str, client: Principal | None) -> tuple[str, str, str]:
    """``snapshot.resource(uri)`` and the URI the client's policy is matched against
    (``_policy_uri``); a URI whose match against the templates was given up (a bound,
    ``catalog_resources.READ_SCAN``) is counted and logged as a refusal, once."""
    try:
        upstream, upstream_uri = snapshot.resource(uri)
        return upstream, upstream_uri, _policy_uri(snapshot, upstream, upstream_uri, uri)
    except UnmatchedURI as exc:
        label = client.label if client is not None else ""
        refused("name", "refused a resource of %s: %s", label, str(exc), peer=label)
        raise


def _policy_uri(snapshot: CatalogSnapshot, upstream: str, upstream_uri: str, uri: str) -> str:
    """The public URI a client's policy is matched against for a read of ``uri``: ``uri``,
    unless it is an alias in ``upstream``'s namespace of a URI the catalog serves as its own
    (``docs+file:///a`` for docs's ``file:///a``: a policy allowing that allows both), not
    a web address's page; a match given up raises ``UnmatchedURI``: fails closed."""
    try:
        served = uri == upstream_uri or snapshot.resource(upstream_uri) == (upstream, upstream_uri)
    except UnmatchedURI:
        raise
    except UnknownName:
        served = False
    return upstream_uri if served else uri


class Proxy:
    """Routes public names to upstream sessions through the current catalog snapshot."""

    def __init__(self, catalog: Catalog, pool: UpstreamPool, dedicated: DedicatedSessions) -> None:
        self._catalog = catalog
        self._pool = pool
        self._dedicated = dedicated
        self.held = HeldCalls(self._concurrency_of)
        """Modern clients' calls held across rounds for a handshake-era upstream's questions."""
        self._followed: tuple[int, dict[tuple[str, str, str], str]] = (-1, {})
        """The URI each subscription's policy is matched against (``follows``), this version."""

    def _concurrency_of(self, upstream: str) -> int | None:
        """``upstream``'s ``max_concurrency`` (None: none, or no such upstream)."""
        known = self._pool.upstreams.get(upstream)
        return known.guard.limit if known is not None else None

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        caller: Caller | None,
        client: Principal | None = None,
        held: bool = False,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Check the client's policy, validate and forward a tool call. The client is
        ``client``, else the caller's (an agent run's calls carry the run's client).
        ``held``: a client's own call, which may be held across rounds (``held_calls``).

        Raises:
            UnknownName, NotAllowed, ClientLimited, InvalidArguments, UnknownRound, UpstreamError
        """
        snapshot = self._catalog.snapshot
        who = _identity(caller, client, "tool", name)
        # The policy first: a name outside it is refused alike whether it exists, is held for
        # review or not (the lookup's answers would tell a restricted client which do).
        who.check("tool", name)
        origin = snapshot.tool(name)
        await snapshot.validate_arguments(name, arguments)
        if held and caller is not None and (round_of := self.held.resumed(caller, name)) is not None:
            with who.calling():
                return _linked(await self.held.round(round_of, caller), origin.upstream, self._catalog)
        started = time.perf_counter()
        session = await self._session(origin.upstream, caller)
        try:
            with who.calling():
                async with _turn(session, who, origin.name):
                    if held and caller is not None and _may_be_held(caller, session):
                        start = partial(session.call_tool, origin.name, arguments, who=who.label)
                        return _linked(
                            await self.held.call(caller, name, start), origin.upstream, self._catalog
                        )
                    result = await session.call_tool(origin.name, arguments, caller, who.label)
                    return _linked(result, origin.upstream, self._catalog)
        finally:
            logger.debug(
                "tools/call %s -> %s (%.1f ms)", name, session.id, (time.perf_counter() - started) * 1e3
            )

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None, caller: Caller
    ) -> types.GetPromptResult | types.InputRequiredResult:
        """Forward a prompt render (raises UnknownName, ClientLimited or UpstreamError); a
        modern upstream's input requests to a modern client pass as they are."""
        origin = self._catalog.snapshot.prompt(name)
        who = _unseen(caller.client, "prompt", name)
        session = await self._session(origin.upstream, caller)
        with who.calling():  # a slow render holds an upstream's slot as a tool call does
            async with _turn(session, who):
                rendered = await session.get_prompt(origin.name, arguments, caller, who.label)
        if isinstance(rendered, types.InputRequiredResult):
            return _relayed(rendered)
        return linked_prompt(_relayed(rendered), origin.upstream, self._catalog.snapshot)

    async def read_resource(
        self, uri: str, caller: Caller | None, client: Principal | None = None, within: Collection[str] = ()
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        """Forward a resource read for ``client``, else the caller's, ``within`` these upstreams
        if given (raises UnknownName, ClientLimited or UpstreamError; input requests pass)."""
        who = client if client is not None else (caller.client if caller is not None else None)
        upstream, upstream_uri, policy_uri = _routed(self._catalog.snapshot, uri, who)
        who = _unseen(who, "resource", uri, public=policy_uri)
        if within and upstream not in within:  # an agent's read of what another upstream linked to
            raise UnknownName("resource", uri)
        session = await self._session(upstream, caller)
        with who.calling():
            async with _turn(session, who):
                try:
                    read = await session.read_resource(upstream_uri, caller, who.label)
                except UpstreamAnswered as exc:
                    _named_as_read(exc, upstream_uri, uri)
                    raise
        if isinstance(read, types.InputRequiredResult):
            return _relayed(read)
        return public_contents(_relayed(read), upstream, upstream_uri, uri, self._catalog.snapshot)

    async def complete(self, params: types.CompleteRequestParams, caller: Caller) -> types.CompleteResult:
        """Forward ``completion/complete`` for a public prompt or template to its upstream,
        with the reference in the upstream's own names (raises like ``get_prompt``)."""
        snapshot = self._catalog.snapshot
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            origin = snapshot.prompt(ref.name)
            who = _unseen(caller.client, "prompt", ref.name)
            upstream, ref = origin.upstream, ref.model_copy(update={"name": origin.name})
        else:
            entry = next((e for e in snapshot.templates if e.public == ref.uri), None)
            if entry is None:
                raise UnknownName("resource template", ref.uri)
            who = _unseen(caller.client, "resource", ref.uri, "resource template")
            upstream, ref = entry.origin.upstream, ref.model_copy(update={"uri": entry.origin.name})
        session = await self._session(upstream, caller)
        with who.calling():
            async with _turn(session, who):
                sent = params.model_copy(update={"ref": ref})
                return _relayed(await session.complete(sent, caller, who.label))

    async def resource_session(
        self, uri: str, owner: DownstreamSession, client: Principal | None
    ) -> tuple[UpstreamSession, str]:
        """The upstream session ``owner`` reaches public ``uri`` through, and the upstream's URI."""
        snapshot = self._catalog.snapshot
        upstream, upstream_uri, policy_uri = _routed(snapshot, uri, client)
        if client is None or not client.allows("resource", policy_uri):
            raise UnknownName("resource", uri)  # as for a read: probing learns nothing
        return await self._session_of(upstream, owner, client), upstream_uri

    def follows(self, client: Principal, upstream: str, upstream_uri: str, uri: str) -> bool:
        """Whether ``client``'s policy lets it follow public ``uri`` (``upstream``'s
        ``upstream_uri``) now: matched as a read's and a subscription's are (``_policy_uri``),
        so an update to an alias it subscribed to is not held back by the alias's spelling.
        Worked out once per catalog version: an upstream's updates come as often as it likes."""
        snapshot = self._catalog.snapshot
        if self._followed[0] != snapshot.version or len(self._followed[1]) >= _FOLLOWED:
            self._followed = (snapshot.version, {})
        key = (upstream, upstream_uri, uri)
        if (matched := self._followed[1].get(key)) is None:
            matched = ""  # given up (UnmatchedURI): only an allow-all glob matches it
            with suppress(UnmatchedURI):
                matched = _policy_uri(snapshot, upstream, upstream_uri, uri)
            self._followed[1][key] = matched
        return client.allows("resource", matched)

    async def _session(self, upstream: str, caller: Caller | None) -> UpstreamSession:
        if caller is None:
            shared = self._pool.get(upstream)
            if shared.restarting:  # by a reload: the call waits for it (checked first: a call's path)
                await shared.ready()
            return shared.session()
        return await self._session_of(upstream, caller.session, caller.client)

    async def _session_of(
        self, upstream: str, owner: DownstreamSession, client: Principal | None
    ) -> UpstreamSession:
        shared = self._pool.get(upstream)
        if shared.restarting:
            await shared.ready()
        if shared.config.session == "per_client":
            # A dedicated session's share is its client's: one client's many sessions count once.
            label = client.label if client is not None else owner.label
            if owner.modern and client is not None and client.authenticated:  # see dedicated.py
                session = await self._dedicated.get(upstream, standing(client), label, standing=True)
            else:
                session = await self._dedicated.get(upstream, owner, label)
        else:
            session = shared.session()
        owner.used(session.id)
        return session

    async def apply_log_levels(
        self,
        session: DownstreamSession | None,
        sessions: Iterable[DownstreamSession],
        upstream: str | None = None,
    ) -> None:
        """Apply the clients' log levels upstream: after ``session`` set one, or (None) after a
        handshake-era client came or went; ``sessions``: the handshake-era clients now.

        A dedicated upstream session takes its client's level as it is. A shared one takes the
        most verbose level its clients asked for, unless a client that asked for none (and so
        gets whatever the upstream sends) would get less than the upstream's own default:
        then the default stands if no level was ever sent, or else ``debug``, the nearest to it
        that holds nothing back. So one client's ``error`` silences no other's lines, and a
        level is taken back when its client leaves. A level is sent only when it differs from
        the one the session was last sent. Each client's lines are filtered to its own level on
        the way back; a modern client, which opts in per request, gets what a shared
        handshake-era session's level lets through. ``upstream``: only that upstream's shared
        session (it reconnected; another's stuck level must not hold it up).
        """
        shared = _shared_level([s.log_level for s in sessions])
        targets: list[tuple[UpstreamSession, types.LoggingLevel]] = []
        for live in self._pool.live_sessions():
            if upstream is not None and live.name != upstream:
                continue
            if shared is not None and live.level.asked != shared:
                targets.append((live, shared))
            elif shared is None and live.level.asked not in (None, _EVERY_LINE):
                targets.append((live, _EVERY_LINE))
        if session is not None and (own := session.log_level) is not None:
            targets.extend(
                (dedicated, own) for dedicated in self._dedicated.live if dedicated.owner is session
            )
        if not targets:  # nearly always, as clients come and go
            return
        for target, level in targets:  # before any is sent: the next change decides from these
            target.level.ask(level)
        async with anyio.create_task_group() as tg:  # side by side: a stuck upstream costs one bound
            for target, level in targets:
                tg.start_soon(_set_level, target, level)

    async def roots_changed(self, session: DownstreamSession) -> None:
        """Pass a client's ``notifications/roots/list_changed`` to its dedicated upstream sessions.

        Shared sessions are not told: the roots they would ask for again belong to no one client.
        """
        for dedicated in self._dedicated.live:
            if dedicated.owner is session:
                with anyio.move_on_after(SEND_TIMEOUT):
                    try:
                        await dedicated.roots_changed()
                    except GatewayError as exc:
                        logger.warning("roots/list_changed to %s failed: %s", dedicated.id, exc)
                logger.info("session %s roots changed: told %s", session.id, dedicated.id)

    def pending(self) -> int:
        """Calls in flight upstream, on shared and dedicated sessions."""
        return sum(s.pending for s in [*self._pool.live_sessions(), *self._dedicated.live])

    def holds_dedicated(self, session: DownstreamSession) -> bool:
        """Whether ``session`` holds dedicated upstream sessions or URL elicitations (a modern: none)."""
        return self._dedicated.holds(session.id) or (not session.modern and self._pool.showed(session.id))

    async def end_session(self, session: DownstreamSession) -> None:
        self._pool.client_ended(session.id)
        await self._dedicated.close(session.id)


_EVERY_LINE: types.LoggingLevel = "debug"

_FOLLOWED = 4096
"""Subscriptions whose policy URI ``follows`` keeps for one catalog version (then it starts over)."""


def _may_be_held(caller: Caller, session: UpstreamSession) -> bool:
    """Whether the upstream may ask ``caller`` something only a held call can carry: a modern
    client that can answer, a handshake-era upstream session that outlives the request."""
    caps = caller.capabilities
    answers = caps is not None and (caps.sampling or caps.elicitation or caps.roots) is not None
    return answers and caller.modern and not session.modern and session.owner is not caller.session


def _shared_level(levels: list[types.LoggingLevel | None]) -> types.LoggingLevel | None:
    """The level a shared upstream session should run at for clients that asked for
    ``levels`` (None: asked for none); None: the upstream's own default."""
    asked: list[types.LoggingLevel] = [level for level in levels if level is not None]
    if not asked:
        return None
    most = min(asked, key=LEVELS.index)
    return most if len(asked) == len(levels) or LEVELS.index(most) == 0 else None


async def _set_level(target: UpstreamSession, level: types.LoggingLevel) -> None:
    with anyio.move_on_after(SEND_TIMEOUT):
        try:
            await target.set_logging_level(level)
        except GatewayError as exc:  # one upstream refusing must not fail the client's request
            logger.warning("logging/setLevel %s on %s failed: %s", level, target.id, exc)
