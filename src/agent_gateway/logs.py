"""Log lines that name the trace they belong to (ids on every record, and a JSON format), and
whose values are cut to a bounded length."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Hashable
from typing import Any

from opentelemetry import trace
from pydantic import ValidationError

from agent_gateway.compat.mcp import CLIENT_SESSION_LOGGER
from agent_gateway.errors import describe
from agent_gateway.shown_urls import redacted_url


def scrubbed(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret taken out: whole, in any case, any echo of 8 or more of
    its characters in a row, and a masked form (``sk-…abcd``: its start and its end)."""
    for secret in secrets:
        if len(secret) >= 8:
            text = _without_echoes(text, secret)
            text = re.sub(masked_form(secret), "[redacted]", text, flags=re.IGNORECASE)
        elif secret:
            text = re.sub(re.escape(secret), "[redacted]", text, flags=re.IGNORECASE)
    return text


ECHO = 8
"""Characters of a secret in a row that are its echo (``scrubbed``)."""


def masked_form(secret: str) -> str:
    """The pattern of ``secret`` masked: its start and its end (``sk-…abcd``), any case."""
    return re.escape(secret[:3]) + r"[.*…xX•\-_ ]{2,}" + re.escape(secret[-4:])


def _without_echoes(text: str, secret: str) -> str:
    """``text`` with every run of ``ECHO`` or more characters of ``secret`` (any case) cut."""
    grams = {secret.lower()[i : i + ECHO] for i in range(len(secret) - ECHO + 1)}
    lowered = text.lower()
    if not any(gram in lowered for gram in grams):  # at C speed: most text holds none
        return text
    marked = [False] * len(text)
    for i in range(len(text) - ECHO + 1):
        if lowered[i : i + ECHO] in grams:
            marked[i : i + ECHO] = [True] * ECHO
    out: list[str] = []
    for i, char in enumerate(text):
        if not marked[i]:
            out.append(char)
        elif i == 0 or not marked[i - 1]:
            out.append("[redacted]")
    return "".join(out)


CLIP = 256
"""Characters of one logged value kept: clients choose many of them (names, ids, URIs)."""


def clipped(value: object, limit: int = CLIP) -> object:
    """``value`` as it may be logged: one whose text is longer than ``limit`` is cut, saying
    how long it was (an exception's text can quote a client's input too); numbers as they are."""
    if value is None or isinstance(value, int | float):
        return value
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        return f"{text[:limit]}… ({len(text)} characters)"
    return value


def clip_args(record: logging.LogRecord) -> None:
    """Cut each of ``record``'s arguments to ``CLIP`` characters."""
    if isinstance(record.args, tuple) and record.args:
        record.args = tuple(clipped(a) for a in record.args)
    elif isinstance(record.args, dict) and record.args:
        record.args = {k: clipped(v) for k, v in record.args.items()}


class Clipped(logging.Filter):
    """Cuts every argument of every record to ``CLIP`` characters (with ``JsonFormatter``, the
    only writer of structured fields, which cuts those: the places that keep a client from
    choosing how much is written), and takes credentials and query values out of any URL in
    the message (a library's debug line prints the URL it requested)."""

    def filter(self, record: logging.LogRecord) -> bool:
        clip_args(record)
        message = record.getMessage()
        if "://" in message or "?" in message:
            record.msg, record.args = redacted_url(message), ()
        return True


PEER_LOGGERS = (
    "mcp.client.",
    "agent_gateway.compat.sse",
    "agent_gateway.upstreams.correlation",
    "agent_gateway.upstreams.forwarding",
    "agent_gateway.upstreams.http_transport",
    "agent_gateway.upstreams.pace",
    "opentelemetry.trace.span",  # a client's malformed tracestate (the SDK's TraceState)
    "opentelemetry.attributes",  # a span attribute cut: a client's URI, an upstream's error
    "agent_gateway.upstreams.replies",
    "agent_gateway.upstreams.session",
    "agent_gateway.upstreams.stdio",
    "agent_gateway.upstreams.websocket",
    "agent_gateway.catalog",
    "opentelemetry.trace.propagation",
    "opentelemetry.baggage",
    "agent_gateway.refusals",
    "fastmcp.server.auth",
)
"""Loggers (and the SDK's client session's, ``CLIENT_SESSION_LOGGER``) whose warnings are
about what a peer sent (an upstream's malformed notification, question outside any call or
listing's repeated names; a client's ``traceparent`` over 512 characters, ``tracestate`` of
over 32 members or one malformed, or ``baggage`` over 8 KiB, one warning each request that
carried one; a span attribute cut to its bound, a client's URI or session id, an upstream's
error message: one warning each; a token FastMCP's verifier refused): the peer chooses how many."""
POLICY_REFUSED = "client %s refused %s %r (policy %s)"
UNSEEN_REFUSED = "client %s refused %s %r (answered as unknown)"
NO_IDENTITY_REFUSED = "refused %s %r: the request carries no identity"
QUESTION_REFUSED = "%s from %s for session %s refused: %s"
"""An upstream's question its caller cannot take: the upstream chooses how many."""
PEER_LINES = frozenset(
    {
        ("mcp.server.runner", "dropped %r: malformed params"),
        ("agent_gateway.access", POLICY_REFUSED),
        ("agent_gateway.proxy", UNSEEN_REFUSED),
        ("agent_gateway.proxy", NO_IDENTITY_REFUSED),
        ("agent_gateway.downstream.caller", QUESTION_REFUSED),
        ("mcp.server.request_state", "requestState rejected on %s: %s"),
        # uvicorn's, one for each connection a client opens (through the gateway's handler:
        # uvicorn's own configuration wrote them past these filters and the JSON format).
        ("uvicorn.error", "Invalid HTTP request received."),
        ("uvicorn.error", "Unsupported upgrade request."),
        ("uvicorn.error", "Exceeded concurrency limit."),
    }
)
"""Lines of other loggers that are about what a peer sent or asked (a client's notification
the SDK cannot read: one warning each POST; a name its policy does not let it reach: one each
call, 4,300 lines in 5 s from eight callers); their other lines are the gateway's own."""
PEER_FAILURES = frozenset(
    {
        # The SDK's legacy SSE client: a POST that failed (its writer stops; the session is
        # lost for it, ``upstreams.transports.WritesEnded``), an event it could not read.
        ("mcp.client.sse", "Error in post_writer"),
        ("mcp.client.sse", "Error parsing server message"),
    }
)
"""Lines written with a traceback for what a peer did (an upstream's HTTP status, a reset):
written as one line naming the failure, bounded as the peer's other lines are."""
REPEAT_WINDOW = 10.0
"""Seconds within which one such line is written once, the rest counted."""
_KIND = 40
"""Characters of a message's template that make its kind."""
_KINDS = 1000
"""Kinds remembered at most (the oldest forgotten first)."""


class Repeats:
    """Which of a stream of kinds to write now: the first of each kind in a window, then none
    until the window has passed, counting those left out (the next one written says how many).
    At most ``kinds`` are remembered, the oldest forgotten first. Thread-safe."""

    def __init__(self, window: float, kinds: int) -> None:
        self._window = window
        self._kinds = kinds
        self._seen: dict[Hashable, tuple[float, int]] = {}
        """Kind -> (when its window began, left out since); oldest kind first."""
        self._lock = threading.Lock()  # log handlers may be called from any thread

    def first(self, kind: Hashable) -> int | None:
        """None: ``kind`` is left out now (counted); else how many like it were since the last."""
        now = time.monotonic()
        with self._lock:
            began, left_out = self._seen.get(kind, (-math.inf, 0))
            if now - began < self._window:
                self._seen[kind] = (began, left_out + 1)
                return None
            self._seen.pop(kind, None)
            if len(self._seen) >= self._kinds:  # kinds are few; bounded all the same
                del self._seen[next(iter(self._seen))]
            self._seen[kind] = (now, 0)
            return left_out


class PeerRepeats(logging.Filter):
    """Writes a warning about what an upstream sent once per ``REPEAT_WINDOW`` for each kind
    of line, saying how many like it were left out; a pydantic ``ValidationError`` (the
    upstream's malformed message) as one line, not a traceback through the SDK. Before, each of
    an upstream's malformed notifications wrote a traceback of dozens of lines.

    A kind is a logger, the peer the line is about (``extra={"peer": ...}``, where the writer
    knows it: one noisy upstream's lines do not hide another's) and the start of the message's
    template: the SDK writes some with f-strings that quote what the upstream sent after a
    colon, each one different."""

    def __init__(self) -> None:
        super().__init__()
        self._repeats = Repeats(REPEAT_WINDOW, _KINDS)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:  # first: each call writes an INFO line
            return True
        if (
            record.name != CLIENT_SESSION_LOGGER
            and not record.name.startswith(PEER_LOGGERS)
            and (record.name, record.msg) not in PEER_LINES
        ):
            return True
        try:
            return self._first_of_its_kind(record)
        except Exception:  # a record this cannot read is written as it is, never lost
            return True

    def _first_of_its_kind(self, record: logging.LogRecord) -> bool:
        template = str(record.msg)
        if not record.args:  # maybe an f-string: what the upstream sent follows its first colon
            template = template.split(":", 1)[0]
        kind = (record.name, str(getattr(record, "peer", ""))[:_KIND], template[:_KIND])
        if (left_out := self._repeats.first(kind)) is None:
            return False
        clip_args(record)  # before the message is made (``Clipped`` comes after, and finds it made)
        message = record.getMessage()
        if record.exc_info is not None and isinstance(error := record.exc_info[1], ValidationError):
            # "1 validation error for X", the field, what was wrong with it: one line.
            message = f"{message}: {clipped('; '.join(line.strip() for line in str(error).splitlines()[:3]))}"
            record.exc_info = record.exc_text = None
        elif record.exc_info is not None and (record.name, record.msg) in PEER_FAILURES:
            failure = record.exc_info[1]
            message = f"{message}: {clipped(describe(failure)) if failure is not None else 'no detail'}"
            record.exc_info = record.exc_text = None
        if left_out:
            message = f"{message} ({left_out} more like it in the {REPEAT_WINDOW:g} s before, not written)"
        record.msg, record.args = message, ()
        return True


class TraceIds(logging.Filter):
    """Puts the current ``trace_id`` and ``span_id`` (hex, or empty) on every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else ""
        record.span_id = format(context.span_id, "016x") if context.is_valid else ""
        return True


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Characters that could start a line of their own or move the terminal (a tab is kept): C0
and C1 controls, the line and paragraph separators (a line break to ``str.splitlines`` and
to log tools built on it), and the bidirectional overrides and isolates (which make what a
line shows differ from what it holds)."""


def _escaped(character: re.Match[str]) -> str:
    code = ord(character.group())
    return {"\n": "\\n", "\r": "\\r"}.get(
        character.group(), f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    )


def _json_escaped(character: re.Match[str]) -> str:
    return f"\\u{ord(character.group()):04x}"


def one_line(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``'s) with what it leaves raw and that
    breaks or reorders a line escaped: the same value to a JSON reader, one line to every tool.
    Such characters are only ever inside a string there, so escaping them keeps the JSON.
    ASCII text (most lines) is told in constant time, and holds none but DEL."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _CONTROL.sub(_json_escaped, text)


class LineFormatter(logging.Formatter):
    """One log line (the text format; ``JsonFormatter`` builds on it): logging's own formatter,
    but a record's time is formatted with ``strftime`` once a second, not once a line (it was
    half of the access line's formatting); the milliseconds are added as logging adds them.

    A message's control characters are written escaped (``\\n``, ``\\x1b``): what a client or
    an upstream sent (a tool's name, an error's text, a tracestate a library quotes) cannot end
    the line and forge the next one, nor move the terminal. A traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if _CONTROL.search(record.message) is not None:
            record.message = _CONTROL.sub(_escaped, record.message)
        return super().formatMessage(record)

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._second: tuple[int, str] = (-1, "")  # one tuple: handlers may run in other threads

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second, stamp = self._second
        if int(record.created) != second:
            stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (int(record.created), stamp)
        return self.default_msec_format % (stamp, record.msecs) if self.default_msec_format else stamp


class JsonFormatter(LineFormatter):
    """One JSON object per line: time, level, logger, message, trace and span ids, exception,
    and the fields a structured line carries (``extra={"fields": {...}}``)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "trace_id": getattr(record, "trace_id", ""),
            "span_id": getattr(record, "span_id", ""),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):  # structured lines (the access line) bring their own, cut
            line.update({k: clipped(v) for k, v in fields.items()})  # pyright: ignore[reportUnknownVariableType]
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # json.dumps escapes C0 controls only; these it leaves raw are line breaks to
        # ``str.splitlines``, or reorder what a viewer shows. Only ever inside a string.
        return one_line(json.dumps(line, ensure_ascii=False))


SECRET_FLAG = re.compile(
    r"^--?[A-Za-z0-9_-]*(token|key|secret|password|passwd|pwd|auth|credential)", re.IGNORECASE
)


def shown_command(command: str, args: tuple[str, ...]) -> str:
    """A stdio upstream's command line as it may be printed or logged: the value of a flag
    named like a credential (``--api-key X``, ``--token=X``) masked, the value of an
    environment variable named like one wherever it appears (``args: ["${GITHUB_TOKEN}"]``
    is a bare word once expanded), a credential in a well-known format typed as it is, and
    URLs without their credentials or query values (servers take
    ``postgresql://user:password@…`` as an argument)."""
    secrets = _environment_secrets()
    shown: list[str] = []
    for i, arg in enumerate(args):
        for secret in secrets:
            arg = arg.replace(secret, "***")
        arg = KNOWN_CREDENTIAL.sub("***", arg)
        if (value := flagged_secret(args, i)) is not None:
            arg = "***" if value == args[i] else f"{arg.partition('=')[0]}=***"
        shown.append(redacted_url(arg))
    return " ".join([command, *shown])


def flagged_secret(args: tuple[str, ...], i: int) -> str | None:
    """The value ``args[i]`` gives a flag named like a credential: ``X`` of ``--token=X``, or
    the whole of it after ``--api-key``; None if it gives none."""
    flag, equals, value = args[i].partition("=")
    if equals and SECRET_FLAG.match(flag):
        return value
    if i > 0 and SECRET_FLAG.match(args[i - 1]) and "=" not in args[i - 1]:
        return args[i]
    return None


KNOWN_CREDENTIAL = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|xox[abposr]-[\w-]{10,}"
    r"|sk-(?:ant-|proj-)?[\w-]{20,}|AKIA[0-9A-Z]{16}|AIza[\w-]{35}|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]+)"
)
"""Credentials in the published formats of the services MCP servers most often take one for
(GitHub, GitLab, Slack, OpenAI, Anthropic, AWS, Google; a JWT), however given: typed into a
configuration's ``args`` as they are, no flag or variable names them."""
_SECRET_VARIABLE = re.compile(r"token|key|secret|passw|credential|auth", re.IGNORECASE)
_SECRET_LEAST = 8
"""Characters an environment variable's value needs to be masked where it appears (shorter
ones are words: ``1``, ``true``, a region)."""


def _environment_secrets() -> list[str]:
    """The values of this process's environment variables named like credentials, longest
    first (a configuration's ``${VAR}`` is expanded from this environment)."""
    values = {
        value
        for name, value in os.environ.items()
        if _SECRET_VARIABLE.search(name) and len(value) >= _SECRET_LEAST and not value.startswith("/")
    }
    return sorted(values, key=len, reverse=True)
