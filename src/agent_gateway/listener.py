"""The HTTP listener's own bounds, before any request reaches the app.

uvicorn keeps a connection for as long as the client likes while it has not sent a whole
request head (a connection that sends nothing, or a byte every few seconds, is never timed
out), and accepts connections until the process runs out of file descriptors, after which
nothing works: not ``/healthz``, not the gateway's own connections to its upstreams. So:

- a deadline for a request's head (``server.connections.header_timeout``), from the moment
  the connection opens and again after each response (a keep-alive connection must send its
  next head in time too); past it the connection is closed;
- a cap on open connections, derived from ``RLIMIT_NOFILE`` so that the gateway's own
  sockets, pipes and files always have room; past it a new connection gets a bare 503 and is
  closed;
- a cap per client address, so one address cannot take all of them;
- a bound on a request head's size and its number of header lines
  (``server.connections.max_head_bytes``, ``max_headers``): httptools' parser has none and
  keeps a header it is still reading whole, so one connection sending an endless head grew
  the process by gigabytes within the head deadline. Past either bound the client gets 431
  and the connection is closed. The lines are counted after each read and before a request
  is served (not line by line: a call per header line cost every request about 3 µs);
- a bound on the requests pipelined behind the one being served (``MAX_PIPELINED``): uvicorn
  parses every request a read holds and queues it, and reads on after each answer, so one
  connection pipelining small requests queued hundreds of thousands (170 MB to 1 GB in 20 s).
  Past it nothing more of the connection is read: the requests queued are answered, then it
  is closed (its client retries the rest, as RFC 9112 9.3.2 has a client do for pipelined
  requests a closed connection left unanswered). One whose waiting request has sent more
  than ``PIPELINED_BODY_BYTES`` of its body is dropped;
- a deadline for a client to read what it was sent (``server.connections.write_timeout``):
  once a connection's write buffer is full, the client must read some of it within that time
  (and again within each such time while it stays full), at least ``min_read_rate`` bytes a
  second on average (or half of what waited), or the connection is dropped. Without it a
  client that asks for large answers and never reads them keeps them in memory as long as
  it likes (and with them the bound all clients share on answers in flight, ``in_flight``).

The bounds ride on uvicorn's httptools protocol (the parser uvicorn picks): the members used
are ``connection_made``, ``connection_lost``, ``on_headers_complete``,
``on_response_complete``, ``on_message_complete``, ``on_body``, ``data_received``,
``send_400_response``, ``_unsupported_upgrade_warning``, ``_start_asgi_task``, ``shutdown``,
``pause_writing``, ``resume_writing``, ``cycle`` (its ``response_complete``, ``disconnected``,
``message_event``), ``headers`` (which
``on_header`` appends a head's and trailers' lines to; an absolute-form target's authority
replaces its Host there), ``url`` (the request target), ``pipeline`` and ``transport``;
``tests/test_compat.py`` checks they still exist.

The same protocol sends a response's head with its body: uvicorn writes the head when the
response starts and the body when it comes, two system calls and two TCP segments for
every answer, which the client then reads twice (``head_with_body.HeadWithBody``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from agent_gateway.addresses import client_key
from agent_gateway.config import ConnectionsConfig
from agent_gateway.head_with_body import HeadWithBody
from agent_gateway.host_check import target_authority
from agent_gateway.refusals import refused

logger = logging.getLogger(__name__)

_RESERVED_FDS = 256
"""Descriptors kept for everything that is not a client connection: upstream sockets and
pipes, the conversation database, log files, the event loop's own."""
_PER_UPSTREAM_FDS = 16
_DEFAULT_CAP = 10_000
MAX_PIPELINED = 16
"""Requests one connection may have waiting behind the one being served (clients that
pipeline at all send a few; the MCP SDKs send none)."""
PIPELINED_BODY_BYTES = 64 * 1024
"""Bytes of body a request waiting behind another may have sent (uvicorn holds them, and
reads on at each answer, until its turn: uncounted in flight, which counts a body's bytes past
its first 64 KiB)."""
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n"
    b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n\r\n%s"
)


def descriptor_limit() -> int:
    """The process's open-file limit, raised to its hard limit first (as servers do: the
    soft limit is often 1,024 while the hard one allows far more)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65_536)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # not allowed here: live with the soft limit
    return soft


def connection_cap(config: ConnectionsConfig, upstreams: int, fds: int) -> int:
    """How many client connections may be open at once: the configured number, or what the
    descriptor limit leaves after the gateway's own needs (at least 16)."""
    room = max(16, fds - _RESERVED_FDS - upstreams * _PER_UPSTREAM_FDS)
    return min(config.max, room) if config.max is not None else min(room, _DEFAULT_CAP)


@dataclass
class Connections:
    """The open client connections, counted in total and per client (``addresses.client_key``:
    an IPv6 client by its /64)."""

    cap: int
    per_address: int
    header_timeout: float
    max_head_bytes: int = 64 * 1024
    max_headers: int = 200
    write_timeout: float = 30.0
    min_read_rate: int = 4096
    open: int = 0
    by_address: Counter[str] = field(default_factory=Counter[str])

    def admit(self, address: str) -> str | None:
        """Count one more connection from ``address``; the reason if it must be refused."""
        if self.open >= self.cap:
            return f"{self.open} connections open, the limit is {self.cap}"
        key = client_key(address)
        if self.by_address[key] >= self.per_address:
            return f"{self.by_address[key]} connections open from {key}, the limit is {self.per_address}"
        self.open += 1
        self.by_address[key] += 1
        return None

    def release(self, address: str) -> None:
        key = client_key(address)
        self.open -= 1
        self.by_address[key] -= 1
        if self.by_address[key] <= 0:
            del self.by_address[key]


def bounded_protocol(connections: Connections) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``connections``' bounds (see the module docstring)."""
    too_many_lines = f"a request head of over {connections.max_headers} header lines"
    too_many_bytes = f"a request head over {connections.max_head_bytes} bytes"

    class BoundedProtocol(HttpToolsProtocol):
        _address = ""
        _admitted = False
        _deadline: asyncio.TimerHandle | None = None
        _in_head = True
        """No request head is complete since the last began (or the connection opened)."""
        _head_bytes = 0
        _oversize: str | None = None
        """Why the head being read is refused, once it is."""
        _began = False
        """A request ended, and the next one's head began, within the read being fed."""
        _body_fed = 0
        _head_lines = 0
        _trailer_lines = 0
        """Lines after the head's in the request's list: trailers, after a chunked body."""
        _outside = 0
        """Bytes read since the last body byte, while a body is read (see _body_received)."""
        _unread: asyncio.TimerHandle | None = None
        """The write deadline, while the write buffer is full."""
        _upgraded = False
        """A request asked for another protocol: the parser reads nothing after it."""
        _closing = False
        """Requests pipelined past the bound: those queued are answered, then it is closed."""
        _served: RequestResponseCycle | None = None
        """The request being served: uvicorn's ``cycle`` is the one read last."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.transport = HeadWithBody(transport)  # each request's writes go through it
            peer: Any = transport.get_extra_info("peername")
            self._address = str(peer[0]) if isinstance(peer, tuple) and peer else "unix"
            if (reason := connections.admit(self._address)) is not None:
                refused("connections", "refused a connection: %s", reason)
                transport.write(_BUSY)
                transport.close()
                return
            self._admitted = True
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            # uvicorn tells only the request read last (``cycle``) that its client has gone: the
            # one being served, with a request pipelined behind it, was never told: a session's
            # GET stream was held for ever (another GET refused 409), a call ran on unread.
            if (served := self._served) is not None and not served.response_complete:
                served.disconnected = True
                served.message_event.set()
            self._disarm()
            self.resume_writing()
            if self._admitted:
                self._admitted = False
                connections.release(self._address)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._upgraded or self._closing:
                return  # the connection closes once the requests it has are answered
            if self._in_head:
                self._head_received(data)
            else:
                self._body_received(data)

        def _head_received(self, data: bytes) -> None:
            room = connections.max_head_bytes - self._head_bytes
            self._head_bytes += len(data)
            self._began = False
            # A read may hold the head's end and a body: feed what fits, then see whether
            # the head ended within it before counting the rest against it.
            super().data_received(data[:room] if len(data) > room else data)
            if self._in_head and len(self.headers or ()) > connections.max_headers:  # lines so far
                self._refuse_head(too_many_lines)
                return
            if self._too_many_trailers():
                return
            if len(data) <= room or self.transport.is_closing():
                return
            if self._in_head and not self._began:  # still the head this read began in
                self._refuse_head(too_many_bytes)
            else:  # it ended (and another may have begun): the rest is counted afresh
                self.data_received(data[room:])

        def _body_received(self, data: bytes) -> None:
            # Bytes between body bytes are chunk framing, or trailers: header lines, which
            # the parser keeps whole as it does a head's. A read with no body byte in it
            # counts against the same bound.
            self._body_fed = 0
            super().data_received(data)
            if self.transport.is_closing() or self._too_many_trailers() or self._in_head:
                return  # or the body ended within it (a head follows: counted from the next read)
            self._outside = len(data) - self._body_fed if self._body_fed else self._outside + len(data)
            if self._outside > connections.max_head_bytes:
                self._drop(f"over {connections.max_head_bytes} bytes of a request that are not its body")

        def _too_many_trailers(self) -> bool:
            """Drops the connection when the request read last has too many trailer lines."""
            trailing = self._trailer_lines if self._in_head else len(self.headers or ()) - self._head_lines
            if trailing <= connections.max_headers:
                return False
            self._drop(f"over {connections.max_headers} trailer lines")
            return True

        def _drop(self, reason: str) -> None:
            refused("head_size", "dropped a connection from %s: %s", self._address, reason)
            self.transport.abort()  # its request is being served: no answer can be sent instead

        def on_body(self, body: bytes) -> None:
            self._body_fed += len(body)
            super().on_body(body)
            if self.pipeline and len(self.cycle.body) > PIPELINED_BODY_BYTES:  # this one is waiting
                self._drop_pipelined(f"a body past {PIPELINED_BODY_BYTES} bytes waiting its turn")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            # What follows is the next request's head, maybe within the read being fed; the
            # lines counted are its own from now (the request served keeps its list, with
            # any trailer lines after its head's).
            self._trailer_lines = len(self.headers) - self._head_lines
            self._in_head, self._began, self.headers = True, True, []

        def send_400_response(self, msg: str) -> None:
            if self._closing:
                return  # the parser was stopped: no request of its was malformed
            if self._oversize is None:
                super().send_400_response(msg)
            else:
                self._refuse_head(self._oversize)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_head, self._head_bytes, self._outside, self._trailer_lines = False, 0, 0, 0
            authority = target_authority(self.url)  # the Host it is for (host_check)
            if authority is not None and sum(n == b"host" for n, _ in self.headers) <= 1:  # 2: a 400
                self.headers[:] = [(n, v) for n, v in self.headers if n != b"host"] + [(b"host", authority)]
            self._head_lines = len(self.headers)
            if len(self.pipeline) >= MAX_PIPELINED:
                self._close_pipelined()
            if self._head_lines > connections.max_headers:
                self._oversize = too_many_lines
                raise ValueError(self._oversize)  # the parser stops and uvicorn answers 400,
            super().on_headers_complete()  # which send_400_response turns into our 431

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:  # app: uvicorn's type
            self._served = cycle  # a request starts: the first, or the next pipelined one
            super()._start_asgi_task(cycle, app)

        def _close_pipelined(self) -> None:
            """Past the bound the parser stops, and the requests queued (the one served and
            ``MAX_PIPELINED`` behind it) are answered before the connection closes: a client
            that pipelines more, retrying the rest, still gets all answered (dropped at once,
            the answers due were lost too, and a client retrying the same got none)."""
            refused(
                "pipelined",
                "closing a connection from %s: over %d requests pipelined",
                self._address,
                MAX_PIPELINED,
            )
            self._closing = True
            self.shutdown()  # uvicorn's own: the last queued request's answer closes the connection
            raise ValueError("pipelined")  # the parser stops: nothing more of the read is parsed

        def _drop_pipelined(self, why: str) -> None:
            refused("pipelined", "dropped a connection from %s: %s", self._address, why)
            self.transport.abort()  # nothing more is written to it (HeadWithBody)
            raise ValueError(why)  # the parser stops: nothing more of the read is parsed

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # The next request's head is due in time too, unless it has come already (a
            # pipelined request, now running).
            if not self.transport.is_closing() and self.cycle.response_complete:
                self._arm()

        def _unsupported_upgrade_warning(self) -> None:
            # uvicorn takes no upgrade (serving.py), answers the request as plain HTTP (RFC
            # 9110 lets a server ignore Upgrade) and warned twice, a log line any client could
            # repeat at will; its parser then reads nothing more, so a request pipelined after
            # it was lost unanswered on a connection left open. Close once it is answered
            # instead: an unanswered pipelined request is then retried by its client.
            self._upgraded = True
            self._disarm()
            refused("upgrade", "ignored a protocol upgrade from %s", self._address, level=logging.DEBUG)
            self.shutdown()  # uvicorn's own: close now if idle, else once the answer is written

        def _arm(self) -> None:
            self._disarm()
            self._deadline = asyncio.get_running_loop().call_later(connections.header_timeout, self._late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._unread is None:
                self._watch_reading(self.transport.get_write_buffer_size())

        def resume_writing(self) -> None:
            if self._unread is not None:
                self._unread.cancel()
                self._unread = None
            super().resume_writing()

        def _watch_reading(self, buffered: int) -> None:
            loop = asyncio.get_running_loop()
            self._unread = loop.call_later(connections.write_timeout, self._read_since, buffered)

        def _read_since(self, buffered: int) -> None:
            self._unread = None
            read = buffered - (now := self.transport.get_write_buffer_size())
            # A trickle (a segment a window) would hold its answer for days: enough is the
            # rate over the window, or half of what was waiting if that is less.
            if read > 0 and read >= min(connections.min_read_rate * connections.write_timeout, buffered / 2):
                self._watch_reading(now)  # it read enough (slowly): the deadline starts again
                return
            refused(
                "write_timeout",
                "dropped a connection from %s: its client read %d bytes of its answer in %ss",
                self._address,
                max(read, 0),
                connections.write_timeout,
            )
            self.transport.abort()  # close() would wait for the buffer to drain, which it never will

        def _refuse_head(self, reason: str) -> None:
            refused("head_size", "refused a request head from %s: %s", self._address, reason)
            text = f"{reason}; the gateway refuses it".encode()
            self.transport.write(_TOO_LARGE % (len(text), text))
            self.transport.close()

        def _late(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                refused(
                    "header_timeout",
                    "closed a connection from %s: no request head within %ss",
                    self._address,
                    connections.header_timeout,
                    level=logging.INFO,
                )
                self.transport.close()

    return BoundedProtocol
