"""``HeadWithBody`` on a real uvloop connection (the loop ``serve`` runs on): nothing is written
once its client has gone. uvloop raises on a write to a connection already lost, and each
raise was an ERROR traceback; the listener now also tells the request being served that its
client left (``tests/test_listener.py``), so a whole gateway writes nothing there either way:
only the transport on its own shows this guard holding."""

from __future__ import annotations

import asyncio

import anyio
import uvloop

from agent_gateway.head_with_body import HeadWithBody


def written_after_hang_up() -> str | None:
    """On a uvloop loop of its own: a connection whose client hangs up, and once the server has
    seen it lost, an answer's head and body written through ``HeadWithBody``. What raised."""

    async def main() -> str | None:
        lost = asyncio.Event()
        transports: list[HeadWithBody] = []

        class Served(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                transports.append(HeadWithBody(transport))  # type: ignore[arg-type]

            def connection_lost(self, exc: Exception | None) -> None:
                lost.set()

        server = await asyncio.get_running_loop().create_server(Served, "127.0.0.1", 0)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            writer.close()  # the client hangs up
            await asyncio.wait_for(lost.wait(), 10)
            try:
                transports[0].write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
                transports[0].write(b"{}")  # the head is held for this: both written at once
            except RuntimeError as exc:
                return str(exc)
            return None
        finally:
            server.close()

    return uvloop.run(main())


async def test_an_answer_written_after_its_client_hung_up_is_dropped_without_an_error() -> None:
    with anyio.fail_after(20):
        raised = await anyio.to_thread.run_sync(written_after_hang_up)
    assert raised is None, raised  # before: "unable to perform operation on <TCPTransport closed=True …>"
