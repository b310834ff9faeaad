"""What the agent takes of an API provider's HTTP reply: at most ``MAX_REPLY_BYTES`` of body,
counted as it arrives, and never a compressed one.

The provider's SDK reads a reply whole before parsing it, and the run's bound on a reply
(``calls.MAX_REPLY_CHARS``) is checked after that. An endpoint streaming without end took the
gateway to 4.5 GB in a minute; 1 MB of gzip that unpacks to 1 GB, to 4.2 GB, stalling every
other client for seconds. The hooks are the HTTP client's own (its transport, proxies and
keep-alive stay the SDK's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2
from langchain_core.exceptions import ModelConnectionError, ModelTimeoutError

MAX_REPLY_BYTES = 16 * 1024 * 1024
"""Bytes of one reply's body: five times the most a reply the run takes can be as JSON
(500,000 characters, each escaped to at most seven)."""


class ReplyRefused(Exception):
    """The provider's reply was refused unread (not an ``httpx2.RequestError``: not retried)."""


Hook = Callable[[httpx2.Request], Awaitable[None]] | Callable[[httpx2.Response], Awaitable[None]]


def event_hooks() -> dict[str, list[Hook]]:
    """The provider HTTP client's ``event_hooks``."""
    return {"request": [_uncompressed], "response": [_bounded]}


async def _uncompressed(request: httpx2.Request) -> None:
    # A body's size is known as it arrives only when it is not unpacked.
    request.headers["Accept-Encoding"] = "identity"


async def _bounded(response: httpx2.Response) -> None:
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise ReplyRefused(
            f"the model's endpoint answered {encoding}-compressed though asked not to; refused, "
            f"as its size is unknown until unpacked"
        )
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_REPLY_BYTES:
        raise ReplyRefused(_too_large(f"{int(length):,} bytes"))
    response.stream = _Capped(response.stream)


class _Capped(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream | httpx2.SyncByteStream) -> None:
        assert isinstance(stream, httpx2.AsyncByteStream)  # an async client's
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > MAX_REPLY_BYTES:
                raise ReplyRefused(_too_large(f"more than {MAX_REPLY_BYTES:,} bytes"))
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def unreached(exc: BaseException) -> str | None:
    """What a client is told of a failure to reach the model's endpoint (LangChain's
    ``ModelConnectionError`` or ``ModelTimeoutError``, or the SDK's own ``APIConnectionError``
    where no integration wrapped it), or None for another failure. The SDK's text may name the
    endpoint's host, port and address (anthropic 2.17: "Connection to HOST:PORT failed: ..."),
    which are the operator's, as an upstream's are: the client is told the kind of failure (the
    innermost cause's type), the log the whole text."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    timed_out = isinstance(exc, ModelTimeoutError) or "APITimeoutError" in names
    if not (timed_out or isinstance(exc, ModelConnectionError) or "APIConnectionError" in names):
        return None
    root = exc
    for _ in range(_CHAIN):
        if (cause := root.__cause__ or root.__context__) is None:
            break
        root = cause
    kind = f" ({type(root).__name__})" if root is not exc else ""
    what = "did not answer in time" if timed_out else "could not be reached"
    return f"{type(exc).__name__}: the model's endpoint {what}{kind}"


def _too_large(size: str) -> str:
    return f"the model's endpoint answered {size}; a run reads at most {MAX_REPLY_BYTES:,} of one reply"


def refusal(exc: BaseException) -> ReplyRefused | None:
    """The ``ReplyRefused`` behind ``exc`` (an SDK wraps it in its own connection error), or None."""
    seen: BaseException | None = exc
    for _ in range(_CHAIN):
        if seen is None or isinstance(seen, ReplyRefused):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


_CHAIN = 8
"""Causes looked through (the SDKs wrap once or twice)."""
