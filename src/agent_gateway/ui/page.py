"""The status page's HTML, rendered on the server from the gateway's live state.

Sections: each upstream with its state, circuit, transport, tool count, calls in flight (and
waiting their turn), last error and time since it was last up; the catalog with a search box
and each tool's schema; live sessions by client; the last calls (errors highlighted); the
agent's runs with their steps. Every value that came from a client or an upstream is escaped.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from agent_gateway import __version__, rendered
from agent_gateway.activity import Call, Run
from agent_gateway.agent.tool import INPUT_SCHEMA
from agent_gateway.downstream.sessions import DownstreamSession
from agent_gateway.rendered import Rendered
from agent_gateway.server import Gateway
from agent_gateway.ui.catalog import QUERY, Row, Rows, Shelf, found, row, schema_text, view, words_of
from agent_gateway.ui.static import SCRIPT, STYLE
from agent_gateway.ui.text import escape
from agent_gateway.upstreams.pool import UpstreamStatus

logger = logging.getLogger(__name__)

SHOWN_CALLS = 50
SHOWN_RUNS = 20
CLIENT_SHOWN = 64
"""Characters of a client's name (token name, JWT subject) the page shows."""
CATALOG_SHARE = 0.1
"""The most of the event loop's time the catalog's renderings may take."""


@dataclass
class _Live:
    updated: str
    upstreams: str
    rest: str
    """Sessions, calls and runs."""


class StatusPage:
    """The page, its live sections rendered at most once a second (``rendered``) and its
    catalog once per catalog version at most (``_catalog_section``), however many clients ask
    and whatever they ask for."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._sections = Rendered("status page sections", self._render_sections)
        self._catalog: tuple[int, Shelf, str] | None = None
        """The catalog's version as last rendered, its rows, and its first view (no search)."""
        self._rows = Rows()
        self._catalog_cost = (0.0, 0.0)
        """When the catalog's last rendering began (``time.monotonic``), and how long it took."""
        self._page: tuple[_Live, int, bytes] | None = None
        """The page but its nonces, encoded, for the live part and catalog it holds."""
        self._answers: dict[bool, tuple[_Live, int, bytes]] = {}
        """The live part's answer, with the catalog (False) and without (True)."""

    def full(self, nonce: str) -> bytes:
        """The whole page; ``nonce`` lets its own style and script run under the CSP. All but
        the nonce is joined and encoded once per rendering: per request, the page (megabytes
        at 10,000 tools) was joined and encoded anew, which held a bystander's call 0.4 s."""
        live = self._sections.value()
        version, _, catalog = self._catalog_section()
        if self._page is None or self._page[0] is not live or self._page[1] != version:
            middle = (
                f'">{STYLE}</style></head><body><header><h1>agent-gateway</h1><span class=version>'
                f'{escape(__version__)}</span>{live.updated}<span id="stale" hidden>not refreshing</span>'
                f"</header><main>{live.upstreams}"
                '<h2>Catalog</h2><p><input type="search" id="search" placeholder="Search tools: name, upstream, '
                f'description" autocomplete="off" maxlength="{QUERY}"></p>'
                f'{catalog}{live.rest}</main><script nonce="'
            )
            started = time.monotonic()
            self._page = (live, version, middle.encode())
            logger.debug("status page encoded in %.1f ms", (time.monotonic() - started) * 1000)
        return b"".join((_PAGE_START, nonce.encode(), self._page[2], nonce.encode(), _PAGE_END))

    async def live(self, catalog_version: str | None, query: str | None) -> tuple[bytes, int]:
        """The sections the page refreshes, encoded; the catalog only if its version is not
        ``catalog_version``, as ``query`` finds it (each of the two answers without a search
        joined and encoded once per rendering); with how many tools the search looked through."""
        live = self._sections.value()
        version, shelf, catalog = self._catalog_section()
        fresh = catalog_version == str(version)
        if not fresh and words_of(query):
            section, looked = await found(version, shelf, query)
            return f"{live.updated}{live.upstreams}{section}{live.rest}".encode(), looked
        answer = self._answers.get(fresh)
        if answer is None or answer[0] is not live or answer[1] != version:
            text = f"{live.updated}{live.upstreams}{'' if fresh else catalog}{live.rest}"
            answer = self._answers[fresh] = (live, version, text.encode())
        return answer[2], 0

    async def search(self, query: str | None) -> tuple[bytes, int]:
        """The catalog section as ``query`` finds it, encoded; with how many tools it looked through."""
        version, shelf, first = self._catalog_section()
        if not words_of(query):
            return first.encode(), 0
        section, looked = await found(version, shelf, query)
        return section.encode(), looked

    def schema(self, name: str | None) -> bytes | None:
        """The input schema of the tool ``name`` as the page shows it; None: no such tool."""
        gateway = self._gateway
        if gateway.agent is not None and name == gateway.config.agent.name:
            return schema_text(INPUT_SCHEMA).encode()
        origin = gateway.catalog.snapshot.tools.get(name or "")
        return schema_text(origin.item.input_schema).encode() if origin is not None else None

    def _render_sections(self) -> _Live:
        gateway = self._gateway
        return _Live(
            _updated(), _upstreams(gateway), f"{_sessions(gateway)}{_calls(gateway)}{_runs(gateway)}"
        )

    def _catalog_section(self) -> tuple[int, Shelf, str]:
        """The catalog's version, rows and first view as last rendered: again once its version changed,
        but not before ``CATALOG_SHARE`` of the time since the last began has passed, nor
        within ``PAGE_INTERVAL``. Once per version, upstreams changing their lists every
        second made a polled page render 10,000 tools at each (a bystander's p99 85 to 361 ms)."""
        version = self._gateway.catalog.snapshot.version
        started = time.monotonic()
        began, took = self._catalog_cost
        due = began + max(rendered.PAGE_INTERVAL, took / CATALOG_SHARE)
        if self._catalog is None or (self._catalog[0] != version and started >= due):
            rows, fresh = self._catalog_rows()
            shelf = Shelf(rows)
            self._catalog = (version, shelf, view(version, rows))
            self._catalog_cost = (started, time.monotonic() - started)
            took = self._catalog_cost[1] * 1000
            logger.debug("status page catalog rendered in %.1f ms (%d of its rows made)", took, fresh)
        return self._catalog

    def _catalog_rows(self) -> tuple[list[Row], int]:
        """Every tool's row (the agent's first), and how many were made anew."""
        gateway = self._gateway
        rows, fresh = self._rows.update(gateway.catalog.snapshot.tools)
        if gateway.agent is not None:
            about = "The gateway's own agent over these tools."
            name = gateway.config.agent.name
            rows.insert(0, row(name, "(gateway)", about, None))
        return rows, fresh


_PAGE_START = (
    b'<!doctype html><html lang="en"><head><meta charset="utf-8">'
    b'<meta name="viewport" content="width=device-width, initial-scale=1">'
    b'<title>agent-gateway</title><link rel="icon" href="data:,"><style nonce="'
)
_PAGE_END = f'">{SCRIPT}</script></body></html>'.encode()


def _updated() -> str:
    return f'<span id="updated" class="muted" data-live>updated {_clock(time.time())} UTC</span>'


# -- upstreams ---------------------------------------------------------------------------------


def _upstreams(gateway: Gateway) -> str:
    tools = Counter(origin.upstream for origin in gateway.catalog.snapshot.tools.values())
    rows = "".join(
        _upstream_row(status, tools[status.name])
        for status in gateway.pool.statuses(gateway.catalog.problems)
    )
    head = _head("Upstream", "State", "Circuit", "Transport", "Tools", "In flight", "Since", "Last error")
    return _section("upstreams", "Upstreams", head, rows)


def _upstream_row(status: UpstreamStatus, tools: int) -> str:
    state = str(status.state)
    since = (
        f"down {_duration(status.down_for_seconds)}"
        if status.down_for_seconds is not None
        else f"up since {_clock(status.last_up_at)}"
        if status.last_up_at is not None
        else ""
    )
    return (
        f'<tr class="upstream state-{state}" data-name="{escape(status.name)}">'
        f"<td><b>{escape(status.name)}</b></td><td><span class=badge>{state}</span></td>"
        f"<td>{escape(str(status.circuit))}</td><td>{escape(status.transport)}</td><td>{tools}</td>"
        f"<td>{_in_flight(status)}</td><td>{since}</td>"
        f'<td class="error">{escape(_error_of(status))}</td></tr>'
    )


def _in_flight(status: UpstreamStatus) -> str:
    """Its calls in flight, and while its pings say it has calls queued, how many are sent at
    once and how many wait for their turn in the gateway."""
    if status.window is None:
        return str(status.in_flight)
    return f"{status.in_flight} (window {status.window}: {status.sent} sent, {status.waiting} waiting)"


def _error_of(status: UpstreamStatus) -> str:
    if status.listing_refused is None:
        return status.last_error or ""
    refused = f"latest listing refused: {status.listing_refused}"
    return f"{status.last_error}; {refused}" if status.last_error else refused


# -- sessions, calls, runs ---------------------------------------------------------------------


def _client(name: str) -> str:
    """A client's name as shown: a JWT subject is its issuer's to choose (some let a client
    choose its own), and one of 40,000 characters, whole in each of its rows, made every load
    of the page 128 KB for one session and one call."""
    if len(name) <= CLIENT_SHOWN:
        return escape(name)
    return f"{escape(name[:CLIENT_SHOWN])}… ({len(name):,} characters)"


def _sessions(gateway: Gateway) -> str:
    live = sorted(gateway.sessions.live.values(), key=lambda s: (s.subject, s.started))
    counts = Counter(s.subject for s in live)
    summary = ", ".join(f"{_client(client)}: {n}" for client, n in sorted(counts.items())) or "none"
    head = _head(
        "Client",
        "Software",
        "Session",
        "Era",
        "Transport",
        "Open for",
        "Lends its model",
        "Upstream sessions",
    )
    return _section(
        "sessions", f"Live sessions <span class=muted>({summary})</span>", head, map(_session_row, live)
    )


def _session_row(session: DownstreamSession) -> str:
    caps = session.capabilities
    sampling = "yes" if caps is not None and caps.sampling is not None else "no"
    return (
        f"<tr><td>{_client(session.subject)}</td><td>{escape(session.software or '')}</td>"
        f'<td class="mono">{escape(session.id[:12])}</td><td>{session.era}</td><td>{session.transport}</td>'
        f"<td>{_duration(time.monotonic() - session.started)}</td><td>{sampling}</td>"
        f"<td>{len(session.upstream_sessions)}</td></tr>"
    )


def _calls(gateway: Gateway) -> str:
    recent = list(gateway.activity.calls)[-SHOWN_CALLS:][::-1]
    head = _head("Time", "Client", "Call", "Upstream", "Outcome", "ms", "Trace")
    return _section("calls", f"Recent calls {_NEWEST}", head, map(_call_row, recent))


def _call_row(call: Call) -> str:
    who = _client(call.client) + (
        f" <span class=muted>({escape(call.software)})</span>" if call.software else ""
    )
    who += f" <span class=muted>by its agent run {escape(call.run)}</span>" if call.run else ""
    outcome = escape(call.outcome) + (f": {escape(call.detail)}" if call.detail else "")
    return (
        f'<tr class="call{" failed" if call.failed else ""}"><td>{_clock(call.at)}</td><td>{who}</td>'
        f"<td><code>{escape(call.name)}</code> <span class=muted>{escape(call.method)}</span></td>"
        f'<td>{escape(call.upstream or "")}</td><td class="outcome">{outcome}</td>'
        f'<td>{call.duration_ms:.1f}</td><td class="mono">{escape(call.trace_id or "")}</td></tr>'
    )


def _runs(gateway: Gateway) -> str:
    recent = list(gateway.activity.runs)[-SHOWN_RUNS:][::-1]
    head = _head("Started", "Client", "Run", "Status", "Model turns", "Tool calls", "Error")
    return _section("runs", f"Agent runs {_NEWEST}", head, map(_run_row, recent))


def _run_row(run: Run) -> str:
    steps = [
        f"<li>{escape(s.name)} {'<span class=error>failed</span>' if s.is_error else 'ok'} "
        f"<span class=muted>{s.duration_ms:.0f} ms</span></li>"
        for s in run.steps
    ]
    steps += [f"<li>{escape(name)} <span class=muted>running…</span></li>" for name in run.calling]
    return (
        f'<tr class="run{" failed" if run.status == "failed" else ""}"><td>{_clock(run.started)}</td>'
        f'<td>{_client(run.client)}</td><td class="mono">{escape(run.run_id[:12])} '
        f"<span class=muted>thread {escape(run.thread[:24])}</span></td><td>{run.status}</td>"
        f'<td>{run.model_turns}</td><td><ol class="steps">{"".join(steps)}</ol></td>'
        f'<td class="error">{escape(run.error or "")}</td></tr>'
    )


# -- small pieces ------------------------------------------------------------------------------


_NEWEST = "<span class=muted>(newest first)</span>"


def _section(key: str, title: str, head: str, rows: Iterable[str]) -> str:
    """A refreshed section: its title (markup) and a table."""
    return f'<section id="{key}" data-live><h2>{title}</h2><table>{head}<tbody>{"".join(rows)}</tbody></table></section>'


def _head(*names: str) -> str:
    return "<thead><tr>" + "".join(f"<th>{name}</th>" for name in names) + "</tr></thead>"


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S")


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    return f"{whole // 3600}h {whole % 3600 // 60}m"
