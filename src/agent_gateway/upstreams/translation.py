"""The one boundary where the ``mcp`` client's errors (``MCPError``, transport and
validation errors) become the gateway's (``UpstreamError``), for one upstream session.

Over Streamable HTTP each call is its own exchange: an answer that ends before its result
(an SSE stream closed early, a body cut short) is that call's failure, answered as the
upstream's error. Losing the session for it failed every client's calls on that upstream, and a
client could repeat it at will. The upstream's next health check is sent at once instead: an
upstream that died mid-answer fails to connect to it, and is marked down then. Over one connection (stdio, WebSocket, SSE) a closed connection is the
session's end.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import mcp_types as types
from mcp import InputRequiredRoundsExceededError
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from agent_gateway.compat.http_streams import is_cut_short
from agent_gateway.compat.mcp import PageTooLong, result_check_failed
from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import (
    SessionGivenUp,
    UpstreamAnswered,
    UpstreamRejected,
    UpstreamUnavailable,
    describe,
    wire_code,
)
from agent_gateway.json_text import fits
from agent_gateway.logs import ECHO, KNOWN_CREDENTIAL, clipped, flagged_secret, masked_form, scrubbed

if TYPE_CHECKING:
    from agent_gateway.upstreams.session import UpstreamSession

_CUT_SHORT = (httpx2.ReadError, httpx2.RemoteProtocolError)
"""An answer's read failing once it began."""
_BROKEN = (httpx2.TransportError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)


@contextmanager
def translated(session: UpstreamSession, what: str) -> Iterator[None]:
    """The errors of ``what`` (a request on ``session``) raised as the gateway's."""
    try:
        yield
    except MCPError as exc:
        raise _from_mcp_error(session, exc, what) from exc
    except _BROKEN as exc:
        if isinstance(exc, _CUT_SHORT) and _per_call(session):
            raise _cut_short(session, what, describe(exc)) from exc
        # The shared session's reason is every client's to read: not the request that met it.
        session.lose(f"connection failed: {describe(exc)}")
        raise UpstreamUnavailable(session.name, f"connection failed: {describe(exc)}", what=what) from exc
    except PageTooLong as exc:  # a list asked for during a call (its tool's schema)
        raise UpstreamRejected(session.name, f"{what}: {exc}: refused", types.INTERNAL_ERROR) from exc
    except ValidationError as exc:
        raise UpstreamRejected(
            session.name,
            f"{what}: answered with an invalid result: {exc.error_count()} problem(s)",
            types.INTERNAL_ERROR,
        ) from exc
    except InputRequiredRoundsExceededError as exc:  # a modern upstream asking on and on
        raise UpstreamRejected(
            session.name,
            f"{what}: still asking for input after {exc.max_rounds} rounds",
            types.INTERNAL_ERROR,
        ) from exc
    except RuntimeError as exc:  # the SDK's verdict on a result against the tool's output schema
        if not result_check_failed(exc):
            raise
        raise UpstreamRejected(session.name, f"{what}: {clipped(str(exc))}", types.INTERNAL_ERROR) from exc


def _per_call(session: UpstreamSession) -> bool:
    """Whether a closed exchange is one call's (Streamable HTTP), not the session's."""
    return session.config.kind == "streamable-http" and not session.lost.is_set()


def _cut_short(session: UpstreamSession, what: str, why: str) -> UpstreamRejected:
    session.guard.check_soon()  # an upstream that died mid-answer is told from one cut short
    return UpstreamRejected(session.name, f"{what}: its answer ended early ({why})", types.INTERNAL_ERROR)


def _from_mcp_error(session: UpstreamSession, exc: MCPError, what: str) -> Exception:
    # The gateway's own deadlines are its cancel scopes (``UpstreamTimeout``; the SDK's read
    # timeout is never set): a -32001 here is the upstream's answer, its own timeout's, and
    # passes on as one. Read as the gateway's, a tool answering it (any client could ask
    # for it) counted against the upstream's breaker, for every client.
    code = exc.error.code
    # -32000 is also the first server error, which upstreams answer errors of their own with:
    # a closed connection only when the transport says so (an answer cut short, marked; or,
    # over one connection, its read side ended, which sets ``lost`` before the SDK fails the
    # calls pending on it). Read as closed, an upstream's "-32000 bad input", which any client
    # can ask for, ended a stdio session and every client's calls on it.
    if code == types.CONNECTION_CLOSED and is_cut_short(exc.error) and _per_call(session):
        return _cut_short(session, what, exc.error.message)
    if code == types.CONNECTION_CLOSED and (session.lost.is_set() or is_cut_short(exc.error)):
        reason = session.lost_reason or "connection closed"
        session.lose(reason)
        closed = f"connection closed during the call ({reason})"
        return (SessionGivenUp if session.given_up else UpstreamUnavailable)(session.name, closed, what=what)
    message, data = _bounded(exc.error)
    if secrets := secrets_of(session.config):  # on what is passed on: a bounded cost
        message = scrubbed(message, secrets)
        if data is not None:
            data = scrubbed_json(data, partial(scrubbed, secrets=secrets), _scrubber(secrets))
    code, said = wire_code(code)
    return UpstreamAnswered(session.name, f"{what}: {message}{said}", code, data)


MAX_ERROR_MESSAGE = 4096
"""Characters of an upstream's error message passed on (the rest cut, saying how long it was)."""
MAX_ERROR_DATA = 65_536
"""About the most characters of an upstream error's ``data`` passed on: a larger one is left out."""


def cut_message(message: str) -> str:
    """An upstream's error message as the gateway repeats it: ``MAX_ERROR_MESSAGE`` characters
    at most, saying how long it was."""
    if len(message) <= MAX_ERROR_MESSAGE:
        return message
    return f"{message[:MAX_ERROR_MESSAGE]}… ({len(message)} characters)"


def _bounded(error: types.ErrorData) -> tuple[str, Any]:
    """An upstream's error message and ``data`` as they are passed on: passed whole, 30 MB
    of message took the event loop 3 s to scrub of its upstream's credentials (a step per
    character, for each), and reached the client and the log whole."""
    message, data = cut_message(error.message), error.data
    if data is not None and not fits(data, MAX_ERROR_DATA):
        message, data = f"{message} (its data, over {MAX_ERROR_DATA} characters, left out)", None
    return message, data


def secrets_of(config: UpstreamConfig) -> tuple[str, ...]:
    """What the gateway sends an upstream that it must not repeat: the words of its configured
    header and environment values, and of its URL's credentials, long enough to be credentials.
    An upstream's error may quote the credential it was sent (``invalid credentials: 'Bearer
    …'``): taken out of everything the gateway passes on of it (a client's error, the log, the
    status page, ``check``)."""
    values = [*config.headers.values(), *config.env.values(), *_url_credentials(config.url)]
    values += _argument_credentials(config.args)
    return tuple(dict.fromkeys(word for value in values for word in value.split() if len(word) >= 8))


def _argument_credentials(args: tuple[str, ...]) -> list[str]:
    """The credentials a stdio upstream's arguments carry, as ``logs.shown_command`` masks
    them in the log: a flag's named like one (``--api-key X``, ``--token=X``), one in a
    well-known format (``ghp_…``), a URL's (``postgresql://user:password@…``). A server's usage
    error quoting its command line handed them to the client."""
    found: list[str] = []
    for i, arg in enumerate(args):
        found += KNOWN_CREDENTIAL.findall(arg)
        if (value := flagged_secret(args, i)) is not None:
            found.append(value)
        if "://" in arg:
            found += _url_credentials(arg)
    return found


def _url_credentials(url: str | None) -> list[str]:
    """The credentials an upstream's URL carries: its user and password, its query's values
    (``?api_key=…``), as written and decoded. An upstream's error quoting the URL it was asked
    at (``404 for https://…?api_key=…``) handed them to its client, as the log never does."""
    if url is None:
        return []
    parts = urllib.parse.urlsplit(url)
    written = [parts.username or "", parts.password or ""]
    written += [pair.partition("=")[2] for pair in parts.query.split("&")]
    return [form for value in written for form in {value, urllib.parse.unquote_plus(value)} if form]


def unquoted(result: types.CallToolResult, secrets: tuple[str, ...]) -> types.CallToolResult:
    """An upstream's error result as its client gets it: every credential the gateway sends
    the upstream (``secrets_of``) replaced where the result quotes it whole, anywhere in it (its
    text, embedded resources, links, ``structuredContent``, ``_meta``). Its JSON-RPC errors are
    scrubbed above; an error *result* (``isError``, ``invalid credentials: 'Bearer …'``)
    reached the client whole. Only exact occurrences, at C speed: a result has no bound of its
    own (the gateway's records, cut first, also take out echoes in part, in another case or
    masked), and only error results: a configured value is any word of 8 characters
    (``/srv/docs``), which a successful result's paths and text may hold."""
    if not secrets:
        return result
    escaped = tuple(json.dumps(secret)[1:-1] for secret in secrets)  # as JSON spells them
    text = result.model_dump_json(by_alias=True, exclude_unset=True)
    if not any(secret in text for secret in escaped):  # the usual case: one dump, one scan
        return result
    whole = json.loads(text)
    scrubbed = scrubbed_json(whole, partial(_replaced, secrets=escaped), partial(_replaced, secrets=secrets))
    return types.CallToolResult.model_validate(scrubbed)


def _scrubber(secrets: tuple[str, ...]) -> Callable[[str], str]:
    """``scrubbed`` for each of many texts: a short one only when the probe finds something in
    it (5,000 short strings of an error's data took 70 ms of the event loop one by one, 3.5 ms
    so); a long one as it is (its own check, ``in`` at C speed, is faster than the probe's)."""
    probe = _probe(secrets)

    def scrub(text: str) -> str:
        if len(text) <= _PROBED and probe.search(text.lower()) is None:
            return text
        return scrubbed(text, secrets)

    return scrub


_PROBED = 256
"""Characters of a text at most that the probe looks through first (``_scrubber``)."""


def _probe(secrets: tuple[str, ...]) -> re.Pattern[str]:
    """What finds, in a text lower-cased, anything ``scrubbed`` would take out of it."""
    found: list[str] = []
    for secret in secrets:
        if len(secret) >= ECHO:
            found += {re.escape(secret.lower()[i : i + ECHO]) for i in range(len(secret) - ECHO + 1)}
            found.append(masked_form(secret))
        elif secret:
            found.append(re.escape(secret.lower()))
    return re.compile("|".join(found) or r"(?!)", re.IGNORECASE)


def scrubbed_json(value: Any, in_text: Callable[[str], str], in_value: Callable[[str], str]) -> Any:
    """JSON ``value`` scrubbed: ``in_text`` on its JSON text, at C speed, as long as what it
    leaves parses (``value`` itself when it changes nothing); else walked with ``in_value``
    (``scrubbed_value``): a credential of digits quoted as a number leaves a bare ``[redacted]``
    in the text, which no parser reads (the client got an internal error)."""
    dumped = json.dumps(value)
    if (replaced := in_text(dumped)) == dumped:
        return value
    try:
        return json.loads(replaced)
    except json.JSONDecodeError:
        return scrubbed_value(value, in_value)


def scrubbed_value(value: Any, scrub: Callable[[str], str]) -> Any:
    """A JSON value with ``scrub`` applied to its strings and keys, and a number it would change
    made the string ``[redacted]`` (a step in Python per string: ``scrubbed_json`` first)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(str(k)): scrubbed_value(v, scrub) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list | tuple):
        return [scrubbed_value(item, scrub) for item in value]  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value) if isinstance(value, int) else json.dumps(value)
        return value if scrub(text) == text else "[redacted]"
    return value


def _replaced(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` replaced (``text`` itself when it holds none)."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    return text
