"""One client's requests back to back on many connections, as a hostile client writes them.

Run as a process of its own (on a test's or a benchmark's event loop, its own work would be
the bystander's wait), by hand-written HTTP: each request's bytes formatted, each answer read
by its length alone, so the gateway, not this client, is the slower side::

    python -m tests.servers.flood URL CONNECTIONS REQUEST [--seconds S] [--address A] [--token T]

``REQUEST`` is a JSON-RPC request whose ``"id": 0`` is made each request's own (one id in
flight twice is refused), or a notification: it opens one handshake-era session, then floods
it; or an ``initialize``, or ``GET /path``, each sent bare (no session). For ``--seconds`` (or
until its stdin closes), then it prints the answers it got by HTTP status (``23627 200``).
With ``--counting``, a line ``counting`` first, then on each SIGUSR1 a line of how many
answers it has got so far.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
import urllib.parse

HELLO = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "flood", "version": "1"},
    },
}


class Flood:
    def __init__(self, url: str, address: str | None, token: str | None) -> None:
        self.where = urllib.parse.urlsplit(url)
        self.address = address
        head = f"POST {self.where.path} HTTP/1.1\r\nHost: {self.where.netloc}\r\n"
        head += "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
        head += "Mcp-Protocol-Version: 2025-06-18\r\n"
        self.credential = f"Authorization: Bearer {token}\r\n" if token else ""
        self.head = head + self.credential
        self.counted: dict[int, int] = {}

    def request(self, payload: str, session: str = "") -> bytes:
        if payload.startswith("GET "):
            return f"{payload} HTTP/1.1\r\nHost: {self.where.netloc}\r\n{self.credential}\r\n".encode()
        data = payload.encode()
        extra = f"Mcp-Session-Id: {session}\r\n" if session else ""
        return f"{self.head}{extra}Content-Length: {len(data)}\r\n\r\n".encode() + data

    def print_so_far(self) -> None:
        print(sum(self.counted.values()), flush=True)

    async def connected(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        local = (self.address, 0) if self.address else None
        return await asyncio.open_connection(self.where.hostname, self.where.port, local_addr=local)

    async def session(self) -> str:
        reader, writer = await self.connected()
        writer.write(self.request(json.dumps(HELLO)))
        session = (await answer(reader))[1]["mcp-session-id"]
        writer.write(self.request('{"jsonrpc":"2.0","method":"notifications/initialized"}', session))
        await answer(reader)
        writer.close()
        return session

    async def caller(self, k: int, template: str, session: str, end: float) -> None:
        reader, writer = await self.connected()
        n = k * 10**7
        try:
            while time.monotonic() < end:
                n += 1
                writer.write(self.request(template % n if "%d" in template else template, session))
                status = (await answer(reader))[0]
                self.counted[status] = self.counted.get(status, 0) + 1
        finally:  # cancelled too, when the flood is ended from outside
            writer.close()


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """An HTTP answer read whole: its status and its header fields (names lower-cased)."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower().split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    if "content-length" in fields:
        await reader.readexactly(int(fields["content-length"]))
    elif fields.get("transfer-encoding") == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")
    return int(lines[0].split()[1]), fields


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("connections", type=int)
    parser.add_argument("request")
    parser.add_argument("--seconds", type=float, default=float("inf"))
    parser.add_argument("--address")
    parser.add_argument("--token")
    parser.add_argument("--counting", action="store_true")
    args = parser.parse_args()
    flood = Flood(args.url, args.address, args.token)
    if args.counting:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, flood.print_so_far)
        print("counting", flush=True)
    bare = args.request.startswith("GET ") or json.loads(args.request).get("method") == "initialize"
    session = "" if bare else await flood.session()
    template = args.request.replace('"id": 0', '"id": %d', 1)
    end = time.monotonic() + args.seconds
    callers = asyncio.gather(*(flood.caller(k, template, session, end) for k in range(args.connections)))
    if args.seconds == float("inf"):  # until the stdin its parent holds is closed
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        callers.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # its callers' connections closed
            await callers
    else:
        await callers
    print(", ".join(f"{n} {status}" for status, n in sorted(flood.counted.items())), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
