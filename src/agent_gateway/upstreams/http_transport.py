"""The HTTP layer under every Streamable HTTP upstream: httpx2's API over aiohttp's connections.

The SDK's client speaks httpx2, whose connection pool probes every idle connection's socket
(one ``poll`` each) whenever a request is added or removed: with 32 callers in flight that
scan, plus httpcore2's pure-Python HTTP/1.1, cost a third of the gateway's CPU per call.
aiohttp keeps its idle connections in a stack and parses HTTP in C. This transport keeps the
SDK's transport logic (sessions, SSE, resumption, redirect rules) and httpx2's request and
response models, and swaps only the wire: same requests, same bytes, about 0.3 ms less CPU
per call (``bench/README.md``).

Errors are translated here, once, into httpx2's own tree, which is what the SDK catches.

No answer is decoded: httpx2 inflates a gzip or deflate body without bound, so a 1 MB answer
could grow the process by a gigabyte past every bound on message size. Every request asks for
``identity`` (its client's headers, ``transports.py``), and an answer coded anyway reaches the SDK as the bytes it is (which then fail
its parse: that call's error, named as such).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import aiohttp
import httpx2
import yarl

from agent_gateway.compat.httpx2 import URLPattern, get_environment_proxies
from agent_gateway.upstreams.answer import Answer, BodyBound, CutShort, OversizedBody, uncoded
from agent_gateway.upstreams.wire import Origin

_CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ClientProxyConnectionError)
_HEADER_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Target:
    """A URL posted to on every call, worked out once: as sent, its proxy, the request its
    errors name, and (reached directly) its origin's own connections (``wire.py``)."""

    url: yarl.URL
    proxy: str | None
    request: httpx2.Request
    origin: Origin | None = None


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport sending each request on an aiohttp connection pool.

    The aiohttp session is made on first use, inside the event loop that will run it, and
    closed by ``aclose`` (which ``httpx2.AsyncClient.aclose`` calls).
    """

    def __init__(
        self,
        *,
        max_connections: int,
        ssl_context: ssl.SSLContext | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        """``max_body_bytes`` bounds one answer's body (an SSE stream's events are the SDK's to
        bound: it reads them one at a time)."""
        self._max_connections = max_connections
        self._ssl = ssl_context
        self._max_body = max_body_bytes
        self._session: aiohttp.ClientSession | None = None
        self._origins: dict[tuple[str, str, int | None], Origin] = {}
        # HTTP(S)_PROXY and NO_PROXY, read once as httpx2 reads them when it makes a client (it
        # stops reading them once given a transport, so this one must). Not aiohttp's
        # trust_env: that re-reads the environment and ~/.netrc on every request (+0.3 ms).
        # httpx2's own reading and matching (private helpers), so the rules are exactly its.
        patterns = ((URLPattern(key), proxy) for key, proxy in get_environment_proxies().items())
        self._proxies = sorted(patterns, key=lambda item: item[0])

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                ssl=self._ssl if self._ssl is not None else True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # httpx2 decodes Content-Encoding itself, and it set every header already. A
                # POST made here (``post``, through a proxy) asks for no encoding: its answer
                # is read as it comes, and aiohttp's own "gzip, deflate" would get it compressed.
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                # Cookies are httpx2's to keep (per client); aiohttp's jar would add its own.
                cookie_jar=aiohttp.DummyCookieJar(),
                # h11 (httpx2's parser) takes header lines of any length up to its 16 KiB
                # event limit; aiohttp's default is 8 KiB.
                max_line_size=_HEADER_LIMIT,
                max_field_size=_HEADER_LIMIT,
            )
        return self._session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request``; the response body streams from the connection as it arrives.

        Raises:
            httpx2.TransportError: the subclass httpx2 itself would raise (connect, timeout,
                read or protocol error).
        """
        body = await request.aread()
        timeout = _timeout(request.extensions.get("timeout", {}))
        with _translated(request, connecting=True):
            response = await self._client().request(
                request.method,
                _target(request.url),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,  # the SDK decides which redirects to follow
                timeout=timeout,
                proxy=self._proxy_for(request.url),
            )
        return Posted(request, response, self._max_body).as_httpx2()

    def target(self, url: str) -> Target:
        """``url`` worked out for ``post``: reached directly over HTTP or HTTPS, on connections
        of its origin's own (``wire.py``); through a proxy, on aiohttp's."""
        parsed = httpx2.URL(url)
        sent, proxy = _target(parsed), self._proxy_for(parsed)
        origin = None
        if proxy is None and sent.scheme in ("http", "https") and sent.raw_host:
            key = (sent.scheme, sent.raw_host, sent.port)
            origin = self._origins.get(key)
            if origin is None:
                origin = self._origins[key] = Origin(
                    sent,
                    ssl_context=self._ssl,
                    max_connections=self._max_connections,
                    max_body=self._max_body,
                )
        return Target(sent, proxy, httpx2.Request("POST", parsed), origin)

    @asynccontextmanager
    async def post(
        self, target: Target, content: bytes, headers: Mapping[str, str], limits: httpx2.Timeout
    ) -> AsyncIterator[Posted | Answer]:
        """POST ``content`` to ``target`` on its origin's own connections (``wire.py``), or
        through its proxy straight on aiohttp: no httpx2 request or response is built
        (``as_httpx2`` makes one when a caller needs it). Leaving the context gives the
        connection back, or closes it if the body was not read to its end.

        Raises:
            httpx2.TransportError: as ``handle_async_request``.
        """
        if target.origin is not None:
            async with target.origin.post(target.url, target.request, content, headers, limits) as answer:
                yield answer
            return
        with _translated(target.request, connecting=True):
            response = await self._client().post(
                target.url,
                headers=headers,
                data=content,
                allow_redirects=False,
                timeout=_timeout(limits.as_dict()),
                proxy=target.proxy,
            )
        posted = Posted(target.request, response, self._max_body)
        try:
            yield posted
        finally:
            await posted.body.aclose()

    def _proxy_for(self, url: httpx2.URL) -> str | None:
        """The proxy for ``url``: the most specific pattern that matches (None: go direct)."""
        return next((proxy for pattern, proxy in self._proxies if pattern.matches(url)), None)

    async def aclose(self) -> None:
        for origin in self._origins.values():
            origin.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


class Posted:
    """One answer on its aiohttp connection, its body bounded as ``_Body`` bounds it."""

    def __init__(self, request: httpx2.Request, response: aiohttp.ClientResponse, limit: int | None) -> None:
        self.response = response
        self.status = response.status
        self.content_type = response.content_type
        self.sets_cookie = "set-cookie" in response.headers
        self.streamed = response.content_type == "text/event-stream"
        self.body = _Body(request, response, limit, by_event=self.streamed)
        self._request = request

    async def read(self) -> bytes:
        """The whole body (raises ``OversizedBody``, or the read's ``httpx2.TransportError``)."""
        return b"".join([chunk async for chunk in self.body])

    def as_httpx2(self) -> httpx2.Response:
        response = self.response
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers]
        return httpx2.Response(
            response.status,
            headers=uncoded(headers, self._request),  # httpx2 would inflate it without bound
            stream=self.body,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode()},
            request=self._request,
        )


class _Body(httpx2.AsyncByteStream):
    """One response's body, read from its aiohttp connection chunk by chunk.

    A whole answer's bytes count against the process's bound of bytes in flight
    (``in_flight``) from their read until the body is closed, once read to its end (a
    stream's, those of its unfinished event: ``BodyBound.by_event``). The SDK then parses it
    at once, and the pipeline counts the result again when its call has it.
    """

    def __init__(
        self, request: httpx2.Request, response: aiohttp.ClientResponse, limit: int | None, *, by_event: bool
    ) -> None:
        self._request = request
        self._response = response
        self._bound = BodyBound(limit)
        if by_event:
            self._bound.by_event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _translated(self._request, connecting=False):
            try:
                async for chunk in self._response.content.iter_any():
                    self._bound.take(chunk)
                    yield chunk
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
                raise CutShort(f"the answer ended early: {type(exc).__name__}") from exc

    async def aclose(self) -> None:
        self._bound.give_back()
        # A body read to its end gives the connection back to the pool; one left part-read
        # (a cancelled call, an SSE stream given up) closes it: its remaining bytes would
        # otherwise be read as the next response. For a modern-era upstream that disconnect
        # is also the call's cancellation.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def _target(url: httpx2.URL) -> yarl.URL:
    """``url`` as sent: its bytes kept as they are, its credentials left out (httpx2 has already
    turned them into the Authorization header; aiohttp refuses both at once)."""
    return yarl.URL(str(url.copy_with(userinfo=b"")), encoded=True)


def _timeout(limits: Mapping[str, float | None]) -> aiohttp.ClientTimeout:
    """httpx2's timeouts, in aiohttp's terms (no overall deadline: SSE streams)."""
    connect = limits.get("connect")
    pool = limits.get("pool")
    return aiohttp.ClientTimeout(
        total=None,
        connect=None if connect is None or pool is None else connect + pool,
        sock_connect=connect,
        sock_read=limits.get("read"),
    )


@contextmanager
def _translated(request: httpx2.Request, *, connecting: bool) -> Iterator[None]:
    """aiohttp's (and asyncio's) errors as the httpx2 exceptions the SDK handles."""
    try:
        yield
    except _CONNECT_ERRORS as exc:
        raise httpx2.ConnectError(str(exc), request=request) from exc
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx2.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
    except TimeoutError as exc:  # aiohttp's read timeout, SocketTimeoutError, is one
        error = (
            httpx2.ReadTimeout
            if isinstance(exc, aiohttp.SocketTimeoutError) or not connecting
            else httpx2.ConnectTimeout
        )
        raise error(str(exc) or "timed out", request=request) from exc
    except aiohttp.ServerDisconnectedError as exc:
        raise httpx2.RemoteProtocolError(str(exc) or "server disconnected", request=request) from exc
    except aiohttp.ClientPayloadError as exc:
        raise httpx2.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.ClientResponseError as exc:  # a malformed status line or headers
        # Its str() names the URL, which may carry a secret in its query: the message only.
        raise httpx2.RemoteProtocolError(f"{exc.status}, {exc.message}", request=request) from exc
    except (aiohttp.InvalidURL, ValueError) as exc:
        raise httpx2.UnsupportedProtocol(
            f"cannot send to this URL: {type(exc).__name__}", request=request
        ) from exc
    except (aiohttp.ClientError, OSError) as exc:
        error = httpx2.ConnectError if connecting else httpx2.ReadError
        raise error(str(exc) or type(exc).__name__, request=request) from exc


__all__ = ["AiohttpTransport", "OversizedBody", "Posted", "Target"]
