"""``agent-gateway serve``'s process: listen first, then start the upstreams, serve over HTTP
or stdio, reload the configuration on SIGHUP (and file changes with ``--watch``), and stop
on SIGINT/SIGTERM.

The HTTP address is bound before any upstream is started, so a taken port is one line
(``cannot listen on 127.0.0.1:8000: address already in use; pick another port …``) and not
a process tree started only to be stopped again; while the upstreams start it answers probes
(``starting.py``).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import uvicorn

from agent_gateway import runtime
from agent_gateway.compat.fastmcp import run_stdio
from agent_gateway.downstream.stdin import StdinLines
from agent_gateway.errors import CannotServe
from agent_gateway.http import begin_draining, build_app, readiness
from agent_gateway.listener import Connections, bounded_protocol, connection_cap, descriptor_limit
from agent_gateway.reload import Reloader, Stamp
from agent_gateway.server import Gateway
from agent_gateway.starting import StartingAnswers, Unsignalled

logger = logging.getLogger("agent_gateway")


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening), for uvicorn to serve on.

    Raises:
        CannotServe: the address cannot be bound (in use, not allowed, unknown host).
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise CannotServe(f"cannot listen on {where}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CannotServe(f"cannot listen on {where}: {_reason(exc)}") from None
    return sock


def _reason(exc: OSError) -> str:
    if exc.errno is None:
        return str(exc)
    if exc.errno != errno.EADDRINUSE:
        return os.strerror(exc.errno).lower()
    # One line that says what to do: the example gateway.yaml takes its port from the variable.
    return "address already in use; pick another port with --port (or AGENT_GATEWAY_PORT, which the example gateway.yaml reads)"


@dataclass(frozen=True)
class Reloading:
    """How a served gateway takes a new configuration: SIGHUP always, file changes if ``watch``."""

    reloader: Reloader
    watch: Path | None = None
    loaded: Stamp | None = None
    """The watched file's ``reload.stamp`` when the running configuration was read from it."""

    async def run(self, hangups: AsyncIterator[signal.Signals]) -> None:
        """Reload on each of ``hangups`` (SIGHUP, taken since before start-up: one sent while
        starting is applied now) and, with ``watch``, on each change of the file."""
        async with anyio.create_task_group() as tg:
            if self.watch is not None:
                tg.start_soon(self.reloader.watch, self.watch, self.loaded)
            async for _ in hangups:
                await self.reloader.reload()


def serve(gateway: Gateway, reloading: Reloading | None = None) -> None:
    """Serve ``gateway`` over its configured transport until a signal or end of input.

    Raises:
        CannotServe: the HTTP address cannot be bound (nothing has been started).
    """
    server = gateway.config.server
    if server.transport == "stdio":
        if sys.stdin is None:  # started with fd 0 closed: it may be reused for anything
            raise CannotServe("cannot serve over stdio: stdin is closed")
        runtime.run(_serve_stdio, gateway, reloading)
        return
    sock = listening_socket(server.host, server.port)
    try:
        runtime.run(_serve_http, gateway, sock, reloading)
    finally:
        sock.close()


async def _serve_stdio(gateway: Gateway, reloading: Reloading | None) -> None:
    # Signals are taken before any upstream starts, as over HTTP. A stop cancels at once,
    # start-up or not: the one client is the process that started the gateway, and calls in
    # flight are cancelled (their upstreams told). Requests are read by downstream.stdin, which
    # a stop need not wait for while the client keeps stdin open.
    runtime.prepare_heap()
    limit = gateway.config.server.max_body_bytes
    with _signals() as (stops, hangups):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_on_signal, stops, tg.cancel_scope.cancel)
            values = gateway.config.server.max_body_elements
            async with (
                gateway.running(),
                StdinLines(limit, values, grace=gateway.config.server.stdio_drain) as requests,
                anyio.create_task_group() as serving,
            ):
                if reloading is not None:
                    serving.start_soon(reloading.run, hangups)
                runtime.settle_heap()
                await run_stdio(gateway.server, requests)
                serving.cancel_scope.cancel()
            tg.cancel_scope.cancel()


Signals = AsyncIterator[signal.Signals]


@contextmanager
def _signals() -> Generator[tuple[Signals, Signals], None, None]:
    """SIGINT/SIGTERM and SIGHUP, taken from before start-up until the very end: with their
    default actions, one during start-up or a second one while stopping killed the process
    and left the upstreams' processes (in sessions of their own) running."""
    with (
        anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as stops,
        anyio.open_signal_receiver(signal.SIGHUP) as hangups,
    ):
        yield stops, hangups


async def _on_signal(stops: Signals, stop: Callable[[], None]) -> None:
    """``stop`` on the first of ``stops``; later ones are only logged."""
    async for signum in stops:
        logger.info("received %s, shutting down", signum.name)
        stop()
        break
    async for signum in stops:
        logger.info("received %s: already shutting down", signum.name)


async def _serve_http(gateway: Gateway, sock: socket.socket, reloading: Reloading | None) -> None:
    server = gateway.config.server
    app = build_app(gateway)
    options = listener_options(gateway)
    http = Unsignalled(uvicorn.Config(app, log_level="warning", log_config=None, lifespan="on", **options))
    runtime.prepare_heap()  # the socket is bound: the gateway is starting

    serving = False
    starting = anyio.CancelScope()
    drained_by = math.inf
    draining = anyio.Event()

    def stop() -> None:
        nonlocal drained_by
        if not serving:
            starting.cancel()  # still starting: the upstreams started so far are stopped
            return
        # Draining: the listener closes at once (a balancer sends new connections to the
        # other replicas), clients' notification streams end so they reconnect elsewhere,
        # and the calls in flight have drain_timeout to finish.
        logger.info("draining: the calls in flight have %ds to finish", server.drain_timeout)
        drained_by = time.monotonic() + server.drain_timeout
        http.should_exit = True
        draining.set()
        begin_draining(app)

    # SIGTERM or SIGINT while starting stops the start-up (and reaps what it started); a SIGHUP
    # then waits for it (_signals).
    with _signals() as (stops, hangups):
        async with anyio.create_task_group() as signals:
            signals.start_soon(_on_signal, stops, stop)
            # The address answers probes while the upstreams start.
            early = StartingAnswers(sock, options, lambda: readiness(gateway, starting=True)[1])
            signals.start_soon(early.run)
            with starting:
                async with AsyncExitStack() as running:
                    try:
                        await running.enter_async_context(gateway.running())
                    finally:
                        await early.stop()
                    async with anyio.create_task_group() as tg:
                        if reloading is not None:
                            tg.start_soon(reloading.run, hangups)
                        tg.start_soon(_cut_when_drained, gateway, draining)
                        host, port = sock.getsockname()[:2]
                        logger.info("serving on http://%s:%d%s", _url_host(host), port, server.path)
                        runtime.settle_heap()
                        serving = True
                        await http.serve(sockets=[sock])
                        await _unwound(http)
                        await _held_calls_answered(gateway, drained_by)
                        tg.cancel_scope.cancel()
            signals.cancel_scope.cancel()


async def _cut_when_drained(gateway: Gateway, draining: anyio.Event) -> None:
    """Once a drain has run ``drain_timeout``, end the requests still being served with an
    error saying so (``request_wrapper.Drain``): answered and recorded, where uvicorn's own
    cut, ``CUT_GRACE`` later, leaves their clients a bare 500 and the trail no record."""
    await draining.wait()
    seconds = gateway.config.server.drain_timeout
    await anyio.sleep(seconds)
    gateway.drain.cut(f"the gateway is shutting down: the call did not end within {seconds:g}s")


CUT_GRACE = 2.0
"""Seconds after the drain's end for the requests it cut to answer, before uvicorn cancels them."""


async def _unwound(http: uvicorn.Server) -> None:
    """Until the requests uvicorn cancelled (past ``CUT_GRACE``) have unwound, at most
    ``CUT_GRACE`` seconds: each is recorded as it unwinds, and the audit trail closes after."""
    with anyio.move_on_after(CUT_GRACE):
        while http.server_state.tasks:  # noqa: ASYNC110  (polled: no event marks the set's end)
            await anyio.sleep(0.01)


async def _held_calls_answered(gateway: Gateway, by: float) -> None:
    """With several replicas, wait (until ``by``, the drain's end) for the calls held here:
    their clients' retries still come, through the other replicas (``store/rounds.py``). With
    one, none can: the listener is closed."""
    if gateway.rounds is None or not (held := len(gateway.proxy.held)):
        return
    logger.info("draining: %d held calls wait for their clients' answers through other replicas", held)
    with anyio.move_on_after(max(0.0, by - time.monotonic())):
        await gateway.proxy.held.all_ended()


def listener_options(gateway: Gateway) -> dict[str, Any]:
    """``uvicorn.Config`` options for the gateway's listener: its connection bounds."""
    settings = gateway.config.server.connections
    fds = descriptor_limit()
    cap = connection_cap(settings, len(gateway.config.active_upstreams), fds)
    logger.info(
        "accepting up to %d connections (%d per address; open-file limit %d)", cap, settings.per_address, fds
    )
    connections = Connections(
        cap=cap,
        per_address=settings.per_address,
        header_timeout=settings.header_timeout,
        max_head_bytes=settings.max_head_bytes,
        max_headers=settings.max_headers,
        write_timeout=settings.write_timeout,
        min_read_rate=settings.min_read_rate,
    )
    return {
        "http": bounded_protocol(connections),
        # Clients speak MCP over HTTP only: no upgrade is taken, so every connection stays
        # the bounded protocol's, counted until it closes (an upgraded one never was released).
        "ws": "none",
        "timeout_keep_alive": settings.keep_alive_timeout,
        # Who a request is from: X-Forwarded-For only from the proxies named (none by default).
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": list(settings.trusted_proxies),
        # A bound on shutdown (SIGTERM): a call still running after it is cut off (the
        # gateway's own cut comes first: _cut_when_drained).
        "timeout_graceful_shutdown": gateway.config.server.drain_timeout + CUT_GRACE,
    }


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
