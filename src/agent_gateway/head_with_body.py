"""A response's head written with its first body bytes: uvicorn writes the head when the
response starts and the body when it comes, two system calls and two TCP segments for every
answer, which the client then reads twice. The listener's protocol (``listener.py``) wraps
each connection's transport in ``HeadWithBody``."""

from __future__ import annotations

import asyncio
from typing import Any


class HeadWithBody(asyncio.Transport):
    """A connection's transport that holds a response's head until the response's first body
    bytes, and writes both at once. A head whose body is not written in the same turn of the
    event loop (a stream that starts empty) goes out alone at the end of that turn. Nothing is
    written once it is closing (pipelined answers wrote on after a hang-up: uvloop raised)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._transport.is_closing():
            self._head = None
            return
        if self._head is not None:
            data, self._head = self._head + bytes(data), None
        elif data[:9] == b"HTTP/1.1 ":  # uvicorn writes a head whole, in one call
            self._head = bytes(data)
            asyncio.get_running_loop().call_soon(self._flush)
            return
        self._transport.write(data)

    def _flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._head or b"")

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def abort(self) -> None:
        self._head = None
        self._transport.abort()
