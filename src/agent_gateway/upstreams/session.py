"""One live client session to an upstream: its calls (guarded, bounded, their errors
translated by ``translation.py``), its resource subscriptions, and its end. What the upstream
sends back during a call (log lines, progress, questions) is relayed by ``replies``."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import httpx2
import mcp_types as types
from anyio.abc import TaskStatus
from mcp import Client
from mcp.client.session import MessageHandlerFnT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_gateway import __version__
from agent_gateway.compat.capabilities import told
from agent_gateway.compat.resumed import resumed_client
from agent_gateway.config import UpstreamConfig
from agent_gateway.errors import UpstreamRejected, UpstreamTimeout, UpstreamUnavailable
from agent_gateway.meta_keys import SESSION_META_KEY, told_session
from agent_gateway.telemetry import mark_upstream_error, sent_directly, upstream_call
from agent_gateway.upstreams.asking import named
from agent_gateway.upstreams.client_side import EVERYTHING, ClientSide
from agent_gateway.upstreams.forwarding import Forwarder, ToolCall
from agent_gateway.upstreams.guard import Guard
from agent_gateway.upstreams.levels import Level
from agent_gateway.upstreams.listening import ListenStreams
from agent_gateway.upstreams.pace import Pace
from agent_gateway.upstreams.queueing import CallQueue
from agent_gateway.upstreams.replies import Broadcast, Replies
from agent_gateway.upstreams.translation import secrets_of, translated, unquoted

if TYPE_CHECKING:
    from agent_gateway.upstreams.lifecycle import UpdateSink

logger = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="agent-gateway", version=__version__)

_UPDATES_BUFFER = 256
_ENDED_TIMEOUT = 5.0


class UpstreamSession:
    """A connected ``mcp.Client`` and the calls in flight on it."""

    def __init__(
        self,
        name: str,
        config: UpstreamConfig,
        *,
        owner: ClientSide | None = None,
        broadcast: Broadcast | None = None,
        guard: Guard | None = None,
        queue: CallQueue | None = None,
    ) -> None:
        self.name, self.config, self.owner = name, config, owner
        """The downstream session a dedicated (``per_client``) session belongs to; None if shared."""
        self.guard = guard or Guard(name, config)
        """The upstream's breaker and concurrency cap, shared with its other sessions."""
        self.queue = queue  # the upstream's clients' turns, shared likewise; None: sent at once
        self.waiting = 0  # its calls waiting for their turn there: a dedicated one's are in use
        self.id = f"{name}/{uuid.uuid4().hex[:8]}"
        self.pace = Pace(name, self.id, config.notification_rate)  # for its calls' streams too
        self.level = Level(self.id, self._send_level)
        """The log level this session runs at (handshake era: a modern one's is per request)."""
        self.lost = anyio.Event()  # a call found the connection broken: the life loop reconnects
        self.lost_reason: str | None = None
        self.given_up = False  # lost by its own health check (dedicated.py), not its connection
        self._doubted = anyio.Event()  # a call on it timed out: its health check is due (dedicated.py)
        self.replies = Replies(name, owner, broadcast)
        """Where the upstream's log lines and requests go: the client whose call caused them."""
        self._client: Client | None = None
        self._forwarder: Forwarder | None = None
        self._on_message: MessageHandlerFnT | None = None
        self._updates_in, self._updates_out = anyio.create_memory_object_stream[str](_UPDATES_BUFFER)
        self._streams = ListenStreams(
            name, self.id, lambda what: self._calling(None, what), self._queue_update
        )
        """A modern upstream's subscriptions: one listen stream per URI."""
        self.used = time.monotonic()
        """When a call on it last ended or (``dedicated.get``) was about to begin: its idle time."""
        self.subscribed: set[str] = set()
        """The URIs subscribed to on it, in either era (a dedicated one holding any is in use)."""

    # -- the client -----------------------------------------------------------------------

    def new_client(
        self,
        transport: Any,
        message_handler: MessageHandlerFnT,
        resumed: types.InitializeResult | None = None,
    ) -> Client:
        """The ``mcp.Client`` for this session, declaring what can be relayed: its owner's
        capabilities (dedicated) or all (shared). ``resumed``: another replica's handshake."""
        self._on_message = self._watching(message_handler)  # forwarded calls' notifications too
        caps = self.owner.capabilities if self.owner is not None else EVERYTHING
        caps = caps or types.ClientCapabilities()
        options: dict[str, Any] = dict(
            server=transport,
            # No session-wide read timeout (it would bound the handshake): each call has _calling's.
            message_handler=self._on_message,
            logging_callback=self.replies.on_log,
            sampling_callback=self.replies.on_sampling if caps.sampling is not None else None,
            sampling_capabilities=caps.sampling,
            elicitation_callback=self.replies.on_elicitation if caps.elicitation is not None else None,
            list_roots_callback=self.replies.on_roots if caps.roots is not None else None,
            client_info=CLIENT_INFO,
            cache=None,  # the catalog is our cache; a second one would serve stale listings
        )
        if resumed is not None:
            return resumed_client(resumed, **options)
        return Client(mode=self.config.protocol, **options)

    def _watching(self, handler: MessageHandlerFnT) -> MessageHandlerFnT:
        async def on_message(message: Any) -> None:
            # Queued without waiting (relay_updates sends); a modern upstream's updates come on
            # listen streams (ListenStreams) and here too: taking both would relay them twice.
            if isinstance(message, types.ResourceUpdatedNotification) and not self.modern:
                self._queue_update(message.params.uri)
            elif isinstance(message, types.ElicitCompleteNotification):
                await self.replies.on_elicitation_complete(message.params)
            elif isinstance(message, types.ProgressNotification):
                await self.replies.on_progress(message.params)
            await handler(message)

        return on_message

    def _queue_update(self, uri: str) -> None:
        try:
            self._updates_in.send_nowait(uri)
        except anyio.WouldBlock:
            logger.warning("resource updates from %s dropped: clients are not keeping up", self.id)
        except anyio.ClosedResourceError:
            pass  # the session is closing: nobody is left to tell

    async def relay_updates(
        self, sink: UpdateSink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Hand each resource update to ``sink``, and tell it when the session ends (started
        before the session is handed out); hosts a modern upstream's listen streams too."""
        try:
            async with anyio.create_task_group() as tg, self._updates_out:
                with self._streams.hosted_by(tg):
                    task_status.started()
                    try:
                        async for uri in self._updates_out:
                            await sink.updated(self, uri)
                    finally:
                        tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_ENDED_TIMEOUT):
                await sink.ended(self)

    async def subscribe(self, uri: str, *, subscribe: bool = True) -> None:
        """Subscribe to (or unsubscribe from) ``uri`` upstream: ``resources/subscribe``, or a modern
        ``subscriptions/listen`` stream (raises UpstreamRejected, UpstreamUnavailable, UpstreamTimeout)."""
        if not subscribe:  # given up here even when the upstream does not answer
            self.subscribed.discard(uri)
        if self.modern:
            await (self._streams.open(uri) if subscribe else self._streams.close(uri))
        else:
            method = "resources/subscribe" if subscribe else "resources/unsubscribe"
            request: types.SubscribeRequest | types.UnsubscribeRequest = (
                types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
                if subscribe
                else types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
            )
            with self._calling(None, f"{method} {uri!r}") as client:
                await client.session.send_request(request, types.EmptyResult)
        if subscribe:
            self.subscribed.add(uri)

    async def roots_changed(self) -> None:
        """Tell the upstream its client's roots changed (handshake era; modern has no roots)."""
        if self.modern:
            return
        with self._calling(None, "notifications/roots/list_changed") as client:
            await client.session.send_notification(types.RootsListChangedNotification())

    async def doubted(self) -> None:
        """Wait until a call on this session times out."""
        await self._doubted.wait()
        self._doubted = anyio.Event()

    def lose(self, reason: str | None = None, *, given_up: bool = False) -> None:
        """Give the connection up, failing its pending calls (no ``reason``: its stream ended)."""
        if not self.lost.is_set():
            self.lost_reason, self.given_up = reason, given_up
            self.lost.set()
        self._gone()

    def attach(self, client: Client, http: httpx2.AsyncClient | None = None) -> None:
        """``http``: a Streamable HTTP transport's client, for calls forwarded below the SDK's."""
        self._client = client
        if http is not None and (url := self.config.url) is not None and self._on_message is not None:
            sinks = (self.replies.on_log, self._on_message)
            self._forwarder = Forwarder(http, url, self.config.max_message_bytes, sinks, self.pace)

    def detach(self) -> None:
        """The session is over: no more calls, and its update queue is closed."""
        self._client = self._forwarder = None
        self._updates_in.close()
        self._updates_out.close()
        self._gone()

    def _gone(self) -> None:  # its calls waiting for their turn go on at once, to fail here
        if self.queue is not None:
            self.queue.gone(self)

    @property
    def client(self) -> Client | None:
        return self._client

    @property
    def modern(self) -> bool:
        return self._client is not None and self._client.protocol_version in MODERN_PROTOCOL_VERSIONS

    @property
    def pending(self) -> int:
        """Calls in flight on this session."""
        return self.replies.pending

    # -- calls ------------------------------------------------------------------------------

    async def call_tool(
        self, name: str, arguments: dict[str, Any], caller: ClientSide | None, who: str | None = None
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Call ``name`` upstream for ``caller``, in client ``who``'s share (see ``_calling``); the
        upstream's input requests (``InputRequiredResult``) returned as they are (``_rounds``).

        Raises:
            UpstreamUnavailable, UpstreamTimeout, UpstreamRejected
        """
        timeout = self.config.timeout_of(name)
        with self._calling(caller, f"tool {name!r}", ("tools/call", name), timeout, who) as client:
            progress = self.replies.progress_relay(caller)
            meta = self._meta(caller)
            # A modern caller answers a modern upstream's input requests itself.
            passing = caller if caller is not None and caller.modern and self.modern else None
            if self._forwarder is not None and self.modern:  # over HTTP: below the SDK's client
                sent_directly()
                call = ToolCall(client, name, arguments, meta, progress)
                result = await self._forwarder.forward(call, passing)
            elif passing is not None:
                result = await client.session.call_tool(  # pyright: ignore[reportCallIssue]
                    name,
                    arguments,
                    progress_callback=progress,
                    input_responses=passing.input_responses,
                    request_state=passing.request_state,
                    meta=meta,  # pyright: ignore[reportArgumentType]
                    allow_input_required=True,
                )
            else:
                result = await client.call_tool(name, arguments, progress_callback=progress, meta=meta)  # pyright: ignore[reportArgumentType]
            if isinstance(result, types.CallToolResult) and result.is_error:
                mark_upstream_error("tool_error")
                return unquoted(result, secrets_of(self.config))  # its credential, quoted
            if isinstance(result, types.InputRequiredResult):  # a modern upstream's questions
                return named(self.name, result)
            if isinstance(result, types.CallToolResult):
                return result
            raise UpstreamRejected(
                self.name, f"tool {name!r}: answered with an unknown result", types.INTERNAL_ERROR
            )

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None, caller: ClientSide | None, who: str | None = None
    ) -> types.GetPromptResult | types.InputRequiredResult:
        """Render prompt ``name`` upstream (raises, and returns input requests, like ``call_tool``)."""
        with (
            self._calling(caller, f"prompt {name!r}", ("prompts/get", name), None, who) as client,
            self.replies.progress_token(caller) as token,
        ):
            meta, rounds = self._meta(caller, token), self._rounds(caller)
            if not rounds:
                return await client.get_prompt(name, arguments, meta=meta)  # pyright: ignore[reportArgumentType]
            return named(self.name, await client.session.get_prompt(name, arguments, meta=meta, **rounds))  # pyright: ignore[reportCallIssue, reportArgumentType]

    async def complete(
        self, params: types.CompleteRequestParams, caller: ClientSide | None, who: str | None = None
    ) -> types.CompleteResult:
        """Completions of a prompt's or template's argument (none from an upstream without them)."""
        if (client := self._client) is not None and client.server_capabilities.completions is None:
            return types.CompleteResult(completion=types.Completion(values=[]))
        target = params.ref.name if isinstance(params.ref, types.PromptReference) else params.ref.uri
        operation = ("completion/complete", target)
        with (
            self._calling(caller, f"completion for {target!r}", operation, None, who) as client,
            self.replies.progress_token(caller) as token,  # its reports the caller's, as a read's
        ):
            sent = params.model_copy(update={"meta": self._meta(caller, token)})  # the SDK's, with _meta
            return await client.session.send_request(types.CompleteRequest(params=sent), types.CompleteResult)

    async def read_resource(
        self, uri: str, caller: ClientSide | None, who: str | None = None
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        """Read ``uri`` upstream (raises, and returns input requests, like ``call_tool``)."""
        with (
            self._calling(caller, f"resource {uri!r}", ("resources/read", uri), None, who) as client,
            self.replies.progress_token(caller) as token,
        ):
            meta, rounds = self._meta(caller, token), self._rounds(caller)
            if not rounds:
                return await client.read_resource(uri, meta=meta)  # pyright: ignore[reportArgumentType]
            return named(self.name, await client.session.read_resource(uri, meta=meta, **rounds))  # pyright: ignore[reportCallIssue, reportArgumentType]

    async def set_logging_level(self, level: types.LoggingLevel) -> None:
        """Apply ``level`` upstream, as last asked (``level.ask`` first, see ``levels.py``); not
        to one that did not declare logging, nor again to one that answered Method not found."""
        client = self._client
        if self.modern or client is None or client.server_capabilities.logging is None:
            return
        if "logging/setLevel" not in self.guard.unimplemented:
            await self.level.apply(level)

    async def _send_level(self, level: types.LoggingLevel) -> bool:
        if "logging/setLevel" in self.guard.unimplemented:  # answered so while this one waited its turn
            return False
        request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=level))
        try:
            with self._calling(None, "logging/setLevel") as client:
                # The request itself, not the deprecated helper: the era makes it current here.
                await client.session.send_request(request, types.EmptyResult)
            return True
        except UpstreamRejected as exc:
            if exc.code != types.METHOD_NOT_FOUND:
                raise
            self.guard.unimplemented.add("logging/setLevel")
            logger.info("upstream %s does not implement logging/setLevel: not sent again", self.name)
            return False

    def _rounds(self, caller: ClientSide | None) -> dict[str, Any]:
        """The SDK's arguments passing a modern upstream's input requests to a modern caller as is."""
        if caller is None or not caller.modern or not self.modern:
            return {}
        answers, state = caller.input_responses, caller.request_state
        return {"input_responses": answers, "request_state": state, "allow_input_required": True}

    def _meta(self, caller: ClientSide | None, progress_token: str | None = None) -> dict[str, Any] | None:
        if caller is None:
            return None
        meta: dict[str, Any] = {**caller.client_meta, SESSION_META_KEY: told_session(caller.session_id)}
        if self.modern:  # the modern era opts in to log lines, and says what it answers, per request
            meta[types.CLIENT_CAPABILITIES_META_KEY] = told(caller.capabilities)
            if caller.log_level is not None:
                meta[types.LOG_LEVEL_META_KEY] = caller.log_level
        if progress_token is not None:
            meta["progressToken"] = progress_token
        return meta

    @contextmanager
    def _calling(
        self,
        caller: ClientSide | None,
        what: str,
        operation: tuple[str, str] | None = None,
        timeout: float | None = None,
        who: str | None = None,
    ) -> Iterator[Client]:
        """The client, for one request of ``who`` (a client's label; None: the gateway's own):
        admitted by the guard, bounded by the timeout, its errors translated, an ``operation``'s
        (method, target) span and duration recorded. One generator: it runs on every call."""
        client = self._client
        if client is None:
            raise UpstreamUnavailable(self.name, "not connected")
        if self.lost.is_set():  # closing: its pending calls are being failed
            raise UpstreamUnavailable(self.name, f"connection lost ({self.lost_reason})", what=what)
        limit = timeout or self.config.timeout
        measured = (
            upstream_call(self.name, *operation, self.config.url) if operation is not None else nullcontext()
        )
        with self.guard.admitted(who):
            try:
                with self.replies.calling(caller), measured:
                    with (
                        anyio.CancelScope(deadline=anyio.current_time() + limit) as bound,
                        self.translated(what),
                    ):
                        yield client
                    if bound.cancelled_caught:  # its own deadline: an outer cancel passes through
                        raise TimeoutError
            except TimeoutError as exc:
                self._doubted.set()
                raise UpstreamTimeout(self.name, f"no answer within {limit:g}s", what=what) from exc
            finally:
                self.used = time.monotonic()

    def translated(self, what: str) -> AbstractContextManager[None]:
        """The ``mcp`` client's errors within, as the gateway's (``translation.py``)."""
        return translated(self, what)
