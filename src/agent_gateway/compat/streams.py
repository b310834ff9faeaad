"""Wrappers of the SDK's streams: the part every one repeats, closing with the stream it wraps
and serving as its own async context (the SDK's transports enter the streams they are given)."""

from __future__ import annotations

from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar


class _Closable(Protocol):
    async def aclose(self) -> None: ...


_Inner = TypeVar("_Inner", bound=_Closable)


class StreamWrapper(Generic[_Inner]):
    """A wrapper of an SDK stream (``_inner``): closed with it, and its own async context."""

    _inner: _Inner

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None
