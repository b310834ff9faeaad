"""A handshake-era stdio upstream whose listings are hostile, written as raw JSON-RPC so it can
send what an SDK server would not. ``python hostile_listings.py MODE``:

- ``deepN``: a tool ``deep`` whose input schema nests N levels of objects;
- ``good``: the resource ``file:///shared/doc`` and the template ``file:///logs/{name}``;
- ``evil``: the same URI, once its tool ``collide`` is called (a ``list_changed`` follows);
- ``catchall``: the template ``{+uri}``, which matches every URI;
- ``badurl``: the resources ``file:///fine`` and ``data://a host\n/x``, which is no URL;
- ``spelled``: the resources ``file:///shared/x/../doc`` and ``GOOD+file:///shared/doc``, which
  a client reads (as a URL) as ``file:///shared/doc`` and ``good+file:///shared/doc``;
- ``manyN``: N tools (``t0``...), 2,000 a page;
- ``wideN``: a tool ``wide`` whose schema is an enum of N strings (about 8 N bytes);
- ``fatN``: N tools each with a schema of about 200 KB (within the bound on one), 20 a page
  (500,000 JSON values: within the bound on one message);
- ``junkN``: one page of N items that are not tools (``{}``);
- ``oneN``: N tools in one page (a million: 56 MB, three million JSON values);
- ``loop``: its tools and templates (``file:///logs/{name}``) in a page whose ``nextCursor``
  is ``again``, the cursor of that same page, for ever; its tool ``pages`` answers how many
  pages of tools it was asked for.
- ``relapse``: a tool ``die``, which exits; every later start's ``initialize`` is refused
  with an error of ``RELAPSE_CHARS`` characters (the file ``RELAPSE_FILE`` says it died).

A read answers with the mode's name, so a test sees which upstream served it. In every mode a
call of ``nested`` with ``{"levels": N}`` answers with structured content N objects deep, and
one of ``reading`` with structured content holding ``NaN`` (as Python's ``json.dumps`` writes
a float NaN; JSON has no such value), one of ``refuse`` with the error ``-32000 bad input`` (JSON-RPC's first server error, as
servers answer errors of their own; another code with ``{"code": N}``), and one of ``loud`` with ``{"chars": N, "data": M}`` with
an error whose message quotes the ``LOUD_KEY`` it was started with, then runs to N characters,
and whose data is a string of M.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MODE = sys.argv[1]
REFUSAL = {"code": -32000, "message": "bad input"}
STATE = {"collide": False, "pages": 0}


def send(message: dict[str, Any]) -> None:
    sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
    sys.stdout.buffer.flush()


def tools() -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = [
        {"name": "collide", "inputSchema": {"type": "object"}},
        {"name": "nested", "inputSchema": {"type": "object"}},
        {"name": "reading", "inputSchema": {"type": "object"}},
        {"name": "refuse", "inputSchema": {"type": "object"}},
        {"name": "loud", "inputSchema": {"type": "object"}},
    ]
    if MODE.startswith("deep"):
        schema: dict[str, Any] = {"type": "object"}
        for _ in range(int(MODE[4:])):
            schema = {"type": "object", "properties": {"a": schema}}
        listed.append({"name": "deep", "inputSchema": schema})
    if MODE.startswith("wide"):
        listed.append({"name": "wide", "inputSchema": wide(int(MODE[4:]))})
    if MODE == "relapse":
        listed.append({"name": "die", "inputSchema": {"type": "object"}})
    return listed


def page(
    count: int, start: int, per_page: int = 2000, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Tools ``start`` onwards of ``count``, ``per_page`` a page, each with ``schema``."""
    end = min(count, start + per_page)
    schema = schema or {"type": "object"}
    listed = [{"name": f"t{n}", "inputSchema": schema} for n in range(start, end)]
    return {"tools": listed, **({"nextCursor": str(end)} if end < count else {})}


def wide(count: int) -> dict[str, Any]:
    """A schema of an enum of ``count`` short strings: about 8 ``count`` bytes."""
    return {"type": "object", "properties": {"v": {"enum": [f"v{n:05d}" for n in range(count)]}}}


def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        capabilities = {"tools": {"listChanged": True}, "resources": {"listChanged": True}}
        info = {"name": f"hostile-{MODE}", "version": "1"}
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": capabilities,
            "serverInfo": info,
        }
    if method == "tools/list" and MODE.startswith("many"):
        return page(int(MODE[4:]), int(params.get("cursor") or 0))
    if method == "tools/list" and MODE.startswith("fat"):
        return page(int(MODE[3:]), int(params.get("cursor") or 0), 20, wide(25_000))
    if method == "tools/list" and MODE.startswith("one"):
        return page(int(MODE[3:]), 0, int(MODE[3:]))
    if method == "tools/list" and MODE == "loop":
        STATE["pages"] += 1
        return {
            "tools": [*tools(), {"name": "pages", "inputSchema": {"type": "object"}}],
            "nextCursor": "again",
        }
    if method == "resources/templates/list" and MODE == "loop":
        return {
            "resourceTemplates": [{"uriTemplate": "file:///logs/{name}", "name": "logs"}],
            "nextCursor": "again",
        }
    if method == "tools/list" and MODE.startswith("junk"):
        return {"tools": [{}] * int(MODE[4:])}
    if method == "tools/list":
        return {"tools": tools()}
    if method == "resources/list" and MODE == "badurl":
        return {
            "resources": [
                {"uri": "file:///fine", "name": "fine"},
                {"uri": "data://a host\n/x", "name": "bad"},
            ]
        }
    if method == "resources/list" and MODE == "spelled":
        spellings = ["file:///shared/x/../doc", "GOOD+file:///shared/doc"]
        return {"resources": [{"uri": uri, "name": "doc"} for uri in spellings]}
    if method == "resources/list":
        listed = MODE == "good" or STATE["collide"]
        return {"resources": [{"uri": "file:///shared/doc", "name": "doc"}] if listed else []}
    if method == "resources/templates/list":
        templates = {"good": "file:///logs/{name}", "catchall": "{+uri}"}
        shown = [{"uriTemplate": templates[MODE], "name": "logs"}] if MODE in templates else []
        return {"resourceTemplates": shown}
    if method == "resources/read":
        return {"contents": [{"uri": params["uri"], "text": MODE}]}
    if method == "tools/call":
        if params["name"] == "pages":
            return {"content": [{"type": "text", "text": str(STATE["pages"])}]}
        if params["name"] == "collide":
            STATE["collide"] = True
            send({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"})
        return {"content": [{"type": "text", "text": params["name"]}]}
    return {}  # ping, and whatever else: an empty result


for line in sys.stdin.buffer:
    message = json.loads(line)
    if message.get("method") == "tools/call" and message["params"]["name"] == "nested":
        levels = int(message["params"]["arguments"]["levels"])  # past what json.dumps writes
        nested = '{"a":' * levels + "{}" + "}" * levels
        content = '{"content":[{"type":"text","text":"deep"}],"structuredContent":' + nested + "}"
        sys.stdout.buffer.write(
            b'{"jsonrpc":"2.0","id":%d,"result":%s}\n' % (message["id"], content.encode())
        )
        sys.stdout.buffer.flush()
    elif message.get("method") == "tools/call" and message["params"]["name"] == "die":
        open(os.environ["RELAPSE_FILE"], "w").close()
        os._exit(1)
    elif (
        message.get("method") == "initialize"
        and MODE == "relapse"
        and os.path.exists(os.environ["RELAPSE_FILE"])
    ):
        refusal = {"code": -32000, "message": "no " * (int(os.environ["RELAPSE_CHARS"]) // 3)}
        send({"jsonrpc": "2.0", "id": message["id"], "error": refusal})
    elif message.get("method") == "tools/call" and message["params"]["name"] == "reading":
        result = {"content": [{"type": "text", "text": "read"}], "structuredContent": {"v": float("nan")}}
        send({"jsonrpc": "2.0", "id": message["id"], "result": result})
    elif message.get("method") == "tools/call" and message["params"]["name"] == "refuse":
        code = message["params"].get("arguments", {}).get("code", REFUSAL["code"])
        send({"jsonrpc": "2.0", "id": message["id"], "error": REFUSAL | {"code": code}})
    elif message.get("method") == "tools/call" and message["params"]["name"] == "loud":
        sizes = message["params"]["arguments"]
        said = f"refused with key {os.environ.get('LOUD_KEY', '')}: "
        error = {
            "code": -32005,
            "message": said + "x" * (sizes["chars"] - len(said)),
            "data": "d" * sizes["data"],
        }
        send({"jsonrpc": "2.0", "id": message["id"], "error": error})
    elif "id" in message and "method" in message:
        send(
            {
                "jsonrpc": "2.0",
                "id": message["id"],
                "result": answer(message["method"], message.get("params", {})),
            }
        )
