"""Configuration reload without a restart: on SIGHUP, or when the file changes (``serve --watch``).

The new file is read and validated as at start-up; a bad one is refused with the usual
one-line message and the running configuration is kept. A good one is applied to the
upstreams: added ones are started, removed ones stopped (their processes reaped), changed
ones restarted with their new configuration (with ``failure_mode: fail_open`` their tools
stay listed meanwhile, and calls wait for them), except when only their naming changed
(``prefix``, ``include``, ``exclude``, ``rename``): those keep their connection and are
renamed. The catalog is rebuilt under the new names first (a collision among the upstreams
whose tools are known refuses the reload before anything is touched; one with an added
upstream is handled as any later collision: its listing is refused and reported) and clients
are told it changed.
Unchanged upstreams and every client session go on untouched. Of ``auth``, the tokens,
subjects and policies are applied: each client known gets the policy it would get now, from
its next request (a token left out is refused from its next request; one rotated, its name
kept with another secret, has the sessions its old secret opened ended), and its sessions are
told their lists changed. Every other section (server, agent, search, telemetry, audit, store,
pinning), and the rest of ``auth`` (its mode, JWT settings), is read at start-up only: a change
there is logged as needing a restart (a change to the rest of ``auth`` applies none of it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext

from agent_gateway import access
from agent_gateway.authentication import HashedTokenVerifier, Withdrawn, secret_of, static_tokens_of
from agent_gateway.compat import idle
from agent_gateway.config import AuthConfig, GatewayConfig, UpstreamConfig
from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.errors import ConfigError, TokenWithdrawn
from agent_gateway.refusals import refusals, refused
from agent_gateway.server import Gateway

logger = logging.getLogger(__name__)

_APPLIED = ("upstreams", "env_passthrough")
"""The sections a reload applies; a change to any other is read at start-up only, and is
logged as needing a restart (every section but these, so a new one cannot go unmentioned)."""
_ACCESS = ("tokens", "subjects", "policies")
"""``auth`` fields a reload applies: who may call, and what each client may do (a leaked
token revoked, a policy tightened, needed no restart that would end every session)."""
_NAMING = ("prefix", "include", "exclude", "rename")
"""Upstream fields the catalog alone reads: changing them needs no new connection."""
_STEADY = 0.2
"""Seconds a changed file must stay unchanged before it is read (editors write in steps)."""


@dataclass(frozen=True)
class Changes:
    """What a reload did to the upstreams, and what it could not apply."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    """Restarted with their new configuration."""
    renamed: tuple[str, ...] = ()
    """Only their naming changed: the same connection, new public names."""
    unchanged: tuple[str, ...] = ()
    needs_restart: tuple[str, ...] = ()
    access: bool = False
    """``auth``'s tokens, subjects or policies changed, and nothing else of it: applied."""

    def describe(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("changed", self.changed),
                ("renamed", self.renamed),
            )
            if names
        ]
        if self.access:
            parts.append("auth tokens, subjects and policies applied")
        return "; ".join(parts) or "no upstream changed"


def changes(old: GatewayConfig, new: GatewayConfig) -> Changes:
    """How the upstreams of ``new`` differ from those of ``old``."""
    before, after = old.active_upstreams, new.active_upstreams
    kept = [n for n in after if n in before]
    differ = [n for n in kept if after[n] != before[n]]
    renamed = [n for n in differ if _renamed_only(before[n], after[n])]
    access = old.auth != new.auth and _access_only(old.auth, new.auth)
    return Changes(
        added=tuple(n for n in after if n not in before),
        removed=tuple(n for n in before if n not in after),
        changed=tuple(n for n in differ if n not in renamed),
        renamed=tuple(renamed),
        unchanged=tuple(n for n in kept if n not in differ),
        needs_restart=tuple(
            s
            for s in type(new).model_fields
            if s not in _APPLIED and getattr(old, s) != getattr(new, s) and not (s == "auth" and access)
        ),
        access=access,
    )


def _access_only(old: AuthConfig, new: AuthConfig) -> bool:
    return old.model_copy(update={field: getattr(new, field) for field in _ACCESS}) == new


def _renamed_only(old: UpstreamConfig, new: UpstreamConfig) -> bool:
    return old.model_copy(update={field: getattr(new, field) for field in _NAMING}) == new


async def apply(gateway: Gateway, new: GatewayConfig) -> Changes:
    """Apply ``new``'s upstreams to the running ``gateway``.

    Raises:
        ConfigError: the new names collide in the catalog; nothing was changed.
    """
    found = changes(gateway.config, new)
    sections = (*_APPLIED, "auth") if found.access else _APPLIED
    applied = gateway.config.model_copy(update={section: getattr(new, section) for section in sections})
    restarted = (*found.removed, *found.changed)
    # A restarted upstream's tools stay listed (fail_open): calls wait for it rather than
    # being told "Unknown tool", and clients are told nothing if it lists the same again.
    listed = [n for n in found.changed if applied.active_upstreams[n].failure_mode == "fail_open"]
    # First the catalog (it may still refuse), so clients stop seeing what is about to go.
    await gateway.pins.refresh()  # with a shared database: pins accepted meanwhile are served
    try:
        await gateway.catalog.reconfigure(applied, [n for n in restarted if n not in listed])
    except ConfigError:
        if not listed:
            raise
        # Their former tools collide under the new names: left out until they list again.
        await gateway.catalog.reconfigure(applied, restarted)
    gateway.config = applied
    if found.access:  # now, not after the drains below: a revoked token waits for no upstream
        await _reauthorize(gateway, applied.auth)
    async with anyio.create_task_group() as tg:  # calls in flight given the time a drain gives them
        for name in restarted:
            again = applied.active_upstreams.get(name) if name in found.changed else None
            tg.start_soon(gateway.pool.remove, name, applied.server.drain_timeout, again)
    await gateway.dedicated.reconfigure(applied.active_upstreams, restarted)
    started = (*found.added, *found.changed)
    async with anyio.create_task_group() as tg:
        for name in started:
            tg.start_soon(gateway.pool.add, name, applied.active_upstreams[name], SETTLE_WAIT)
    if connecting := [name for name in started if not gateway.pool.upstreams[name].settled.is_set()]:
        logger.warning(
            "reload: %s not connected within %g s; applied, connecting on in the background",
            ", ".join(connecting),
            SETTLE_WAIT,
        )
    return found


async def _reauthorize(gateway: Gateway, auth: AuthConfig) -> None:
    """``auth``'s tokens, subjects and policies, for every client from its next request."""
    if (tokens := static_tokens_of(gateway.server.auth)) is not None:
        withdrawn = tokens.reconfigure(auth)
        _end_rotated(gateway, tokens)
        _end_withdrawn(gateway, tokens)
        gateway.proxy.held.give_up_of(withdrawn)
    changed = gateway.access.reconfigure(auth)
    logger.info("reload: %d known clients' policies changed", len(changed))
    await gateway.notifier.policies_changed(changed)


def _end_rotated(gateway: Gateway, tokens: HashedTokenVerifier) -> None:
    """End the sessions a token's old secret opened, its name kept with a new one: clients are
    keyed by name, so they went on as the new secret's client, their open streams (which no
    request checks again) relayed all it was. The old secret is refused from its next request."""
    stale = [
        session
        for session in list(gateway.sessions.live.values())
        if session.secret is not None
        and tokens.rotated(session.subject, session.secret)
        and _ended(gateway, session)
    ]
    if stale:
        refusals.add(len(stale), {"reason": "token_rotated"})
        names = sorted({session.label for session in stale})
        logger.warning(
            "reload: %d sessions of rotated tokens ended (%s): opened with a secret now refused",
            len(stale),
            ", ".join(names),
        )


def _ended(gateway: Gateway, session: DownstreamSession) -> bool:
    """End ``session`` (a modern one's listen stream: its other requests are ``_end_withdrawn``'s);
    whether there was one to end."""
    if session.modern:
        return gateway.subscriptions.end_stream(session)
    manager = gateway.sessions.manager
    return manager is not None and idle.end(manager, session.id)  # as its idle timeout would


_WITHDRAWN: dict[Withdrawn, str] = {"rotated": "given a new secret", "removed": "taken out"}


def _error(why: Withdrawn, when: str) -> TokenWithdrawn:
    """The error a request of a token withdrawn ``why`` ends with, ``when`` it met it."""
    then = ": use the new one" if why == "rotated" else ""
    return TokenWithdrawn(f"this request's token was {_WITHDRAWN[why]} by a reload {when}{then}")


def _end_withdrawn(gateway: Gateway, tokens: HashedTokenVerifier) -> None:
    """End the requests being served that came with a static token's secret a reload rotated
    or took out, each with an error saying so, and refuse those admitted before the reload
    that begin after it (their bodies still arriving): a modern-era call (a request of its
    own, no session to end) ran to its end and was answered, after the reload meant to cut its
    token off. Listen streams being served are left to ``_end_rotated`` (ended gracefully; a
    removed token's is relayed nothing)."""

    ending: list[tuple[str, Withdrawn]] = []
    """The token's name and how it was withdrawn, for each request being ended."""

    def running(request: ServerRequestContext[Any, Any]) -> TokenWithdrawn | None:
        if request.method == "subscriptions/listen" or (found := _withdrawn(tokens, request)) is None:
            return None
        ending.append(found)
        return _error(found[1], "while it ran")

    def beginning(request: ServerRequestContext[Any, Any]) -> TokenWithdrawn | None:
        if (found := _withdrawn(tokens, request)) is None:
            return None
        name, why = found
        refused(
            f"token_{why}",
            "request of %s token %s refused as it began: admitted before a reload",
            why,
            name,
            peer=name,
        )
        return _error(why, "before it began")

    gateway.drain.refused = beginning
    gateway.drain.end(running)
    if not ending:
        return
    for why in _WITHDRAWN:
        if count := sum(found[1] == why for found in ending):
            refusals.add(count, {"reason": f"token_{why}"})
    logger.warning(
        "reload: %d requests of rotated or removed tokens being ended (%s): sent with a secret now refused",
        len(ending),
        ", ".join(sorted({name for name, _ in ending})),
    )


def _withdrawn(
    tokens: HashedTokenVerifier, request: ServerRequestContext[Any, Any]
) -> tuple[str, Withdrawn] | None:
    """The name of the static token ``request`` came with, and how a reload withdrew its
    secret, if it did."""
    token = access.token_of(request.request)
    if token is None or (secret := secret_of(token)) is None:
        return None
    if (why := tokens.withdrawn(name := token.subject or token.client_id, secret)) is None:
        return None
    return name, why


SETTLE_WAIT = 5.0
"""Seconds a reload waits for the upstreams it starts to connect (or fail) before it is done:
one that never answers held the reload, and every reload after it, for its connect_timeout
(60 s), saying nothing. Its tools are listed whenever it connects."""


class Reloader:
    """Reloads ``gateway`` from ``load()`` (the file, with the command line's options), one
    reload at a time."""

    def __init__(self, gateway: Gateway, load: Callable[[], GatewayConfig], source: str) -> None:
        self._gateway = gateway
        self._load = load
        self._source = source
        self._lock = anyio.Lock()

    async def reload(self) -> Changes | None:
        """Read the file again and apply it; None when it was refused (the old one is kept)."""
        async with self._lock:
            logger.info("reloading %s", self._source)
            try:
                # Read in a thread: parsing a large file on the event loop stopped every
                # client's calls (and SIGTERM) until it was done. Abandoned at a stop.
                new = await anyio.to_thread.run_sync(self._load, abandon_on_cancel=True)
                found = await apply(self._gateway, new)
            except ConfigError as exc:
                logger.error("reload refused, the running configuration is kept: %s", exc)
                return None
            except Exception:  # a reload never ends the gateway: it serves on as it was
                logger.exception("reload failed, the running configuration is kept")
                return None
            logger.info("reloaded %s: %s", self._source, found.describe())
            if found.needs_restart:
                logger.warning(
                    "reload: %s changed, which is read at start-up only: restart to apply",
                    ", ".join(found.needs_restart),
                )
            return found

    async def watch(self, path: Path, since: Stamp | None = None, interval: float = 1.0) -> None:
        """Reload whenever the file at ``path`` changes (polled every ``interval`` seconds);
        ``since``: its ``stamp`` when the running configuration was read from it, so that a
        change made meanwhile (during start-up) is applied too."""
        seen = since or stamp(path)
        while True:
            await anyio.sleep(interval)
            now = stamp(path)
            if now == seen:
                continue
            while True:  # until it stops changing (and exists)
                await anyio.sleep(_STEADY)
                settled, now = now, stamp(path)
                if settled == now and now is not None:
                    break
            seen = now
            await self.reload()


Stamp = tuple[int, int, int]


def stamp(path: Path) -> Stamp | None:
    """What tells that a file changed: its inode (editors replace it), time and size."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
