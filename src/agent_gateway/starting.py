"""What the HTTP address answers while the gateway starts: probes, and "not yet" to the rest.

Start-up lasts until every upstream has connected or failed once: up to the largest
``connect_timeout`` (60 s by default; a first ``npx`` download takes that long). Before, the
address was bound but not served meanwhile, so a liveness probe failed and an orchestrator
restarted the gateway, which started again, for as long as an upstream was slow. Now the
address is served from the start by a small app: ``/healthz`` answers 200 (the process is
alive), ``/readyz`` 503 saying it is starting (with each upstream's state so far, as it says
once started), and anything else 503 with ``Retry-After``,
its connection closed. Once started it stops, and the gateway's own app serves the same
socket: connections arriving between the two wait in the socket's backlog.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

import anyio
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

_STOP_TIMEOUT = 5.0


Readiness = Callable[[], dict[str, Any]]
"""What ``/readyz`` says meanwhile (``http.readiness``: every upstream's state so far)."""


def while_starting(readiness: Readiness) -> ASGIApp:
    """The ASGI app served until the gateway has started."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/healthz":
            await _answer(send, 200, {"status": "ok"})
        elif scope["path"] == "/readyz":
            await _answer(send, 503, readiness())
        else:
            await _answer(send, 503, {"error": "agent-gateway is starting: try again shortly"}, retry=True)

    return app


async def _answer(send: Send, status: int, body: dict[str, Any], *, retry: bool = False) -> None:
    encoded = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(encoded))]
    if retry:  # closed after it: the client's next try finds the started gateway
        headers += [(b"retry-after", b"1"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": encoded})


class StartingAnswers:
    """``while_starting`` served on ``sock`` (bound, not yet listening) with the gateway's
    connection bounds (``options``): ``run`` it in a task group, ``stop`` it once started."""

    def __init__(self, sock: socket.socket, options: dict[str, Any], readiness: Readiness) -> None:
        app = while_starting(readiness)
        self._server = Unsignalled(
            uvicorn.Config(app, lifespan="off", log_level="warning", log_config=None, **options)
        )
        self._sock = sock
        self._scope = anyio.CancelScope()
        self._stopped = anyio.Event()

    async def run(self) -> None:
        # A duplicate: closing its listener leaves the socket listening for the gateway's server.
        early = socket.socket(fileno=socket.dup(self._sock.fileno()))
        try:
            with self._scope:
                await self._server.serve([early])
        finally:
            early.close()
            self._stopped.set()

    async def stop(self) -> None:
        """Stop answering (requests in progress are answered first, within ``_STOP_TIMEOUT``)
        and return once stopped, so that the gateway's server can take the socket."""
        self._server.should_exit = True
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(_STOP_TIMEOUT):
                await self._stopped.wait()
            self._scope.cancel()  # a no-op once stopped
            await self._stopped.wait()


class Unsignalled(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway takes its signals itself (serving),
    and uvicorn's re-raises the signal after its shutdown, which would kill the process before
    the gateway has closed its upstreams."""

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield
