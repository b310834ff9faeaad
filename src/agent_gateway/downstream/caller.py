"""One client request being served, and what goes back to its client while an upstream
works on it: progress under the client's token, log lines tagged with the upstream's name,
sampling / elicitation / roots requests answered by the client that caused them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import mcp_types as types
from mcp.server.session import ServerSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata

from agent_gateway.access import Principal
from agent_gateway.downstream.input_requests import elicits_by_url, refusal, result_type
from agent_gateway.downstream.sessions import LEVELS, DownstreamSession, relabelled, wanted
from agent_gateway.logs import QUESTION_REFUSED
from agent_gateway.meta_keys import NO_META, client_meta
from agent_gateway.runtime import SEND_TIMEOUT

logger = logging.getLogger(__name__)

_WITHDRAWN = "agent-gateway: the client's request this was asked during has ended"


@dataclass(frozen=True, eq=False)
class Caller:
    """One client request being served: where its progress, logs and questions go.

    Everything is captured in the request's own task: the relays run later on an upstream
    connection's tasks, where the server's request context is not this request's.
    """

    session: DownstreamSession
    server_session: ServerSession
    request_id: types.RequestId | None
    progress_token: types.ProgressToken | None = None
    request_log_level: types.LoggingLevel | None = None
    input_responses: types.InputResponses | None = None
    request_state: str | None = None
    client: Principal | None = None
    """Who asked, from the request's own identity (``AccessControl.identify``); None: no
    identity, so nothing is forwarded for it."""
    client_meta: Mapping[str, Any] = field(default_factory=lambda: NO_META)
    """The client's own ``_meta`` keys of the request (``meta_keys``), passed on upstream."""
    answers: bool = True
    """Whether what an upstream asks during this call reaches the client (False: it has no
    ``capabilities``, and an upstream is told it can answer nothing)."""
    questions: dict[anyio.CancelScope, anyio.Event] = field(default_factory=dict, repr=False)
    """The upstreams' questions (``ask``) its client is answering now, each ended when set."""

    @classmethod
    def of_request(
        cls,
        session: DownstreamSession,
        server_session: ServerSession,
        request_id: types.RequestId | None,
        meta: Mapping[str, Any] | None,
        params: types.InputResponseRequestParams | None = None,
        client: Principal | None = None,
    ) -> Caller:
        """The caller of one request: ``meta`` is its raw wire ``_meta`` (camelCase keys)."""
        meta = meta or {}
        level = meta.get(types.LOG_LEVEL_META_KEY)
        return cls(
            session=session,
            server_session=server_session,
            # As a string, as FastMCP passes it: the transport finds the request's stream by it.
            request_id=None if request_id is None else str(request_id),
            # As the SDK reads it: a string or an integer, never a bool (true would alias 1).
            progress_token=progress_token_from_params({"_meta": meta}),
            request_log_level=level if level in LEVELS else None,
            input_responses=params.input_responses if params is not None else None,
            request_state=params.request_state if params is not None else None,
            client=client,
            client_meta=client_meta(meta),
        )

    def of_runs(self) -> Caller:
        """This request as its agent run's tool calls are made: the run reports its own
        progress (the upstreams' would count on the same token) and sends none of the client's
        ``_meta`` keys; a modern client is asked nothing in them (an upstream's input request
        is answered "the agent cannot supply", ``agent/calls.py``), so an upstream is told so."""
        return replace(
            self,
            progress_token=None,
            input_responses=None,
            request_state=None,
            client_meta=NO_META,
            answers=not self.modern,
        )

    @property
    def session_id(self) -> str:
        return self.session.id

    @property
    def modern(self) -> bool:
        return self.session.modern

    @property
    def lasting(self) -> DownstreamSession:
        return self.session

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self.session.capabilities if self.answers else None

    @property
    def log_level(self) -> types.LoggingLevel | None:
        if self.modern:
            return self.request_log_level
        # A handshake-era client that never set a level gets every line, as a handshake-era
        # server would send them; a modern upstream needs that said per request.
        return self.session.log_level or "debug"

    def progress_relay(self) -> ProgressFnT | None:
        token = self.progress_token
        if token is None:
            return None

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            await self.server_session.send_progress_notification(
                progress_token=token,
                progress=progress,
                total=total,
                message=message,
                related_request_id=None if self.request_id is None else str(self.request_id),
            )

        return relay

    async def log(self, upstream: str, params: types.LoggingMessageNotificationParams) -> None:
        # Modern clients opt in per request; handshake-era ones filter with logging/setLevel.
        threshold = self.request_log_level if self.modern else self.session.log_level
        if (self.modern and threshold is None) or not wanted(params.level, threshold):
            return
        line = types.LoggingMessageNotification(params=relabelled(upstream, params))
        with anyio.move_on_after(SEND_TIMEOUT):
            await self.server_session.send_notification(line, related_request_id=self.request_id)

    async def elicitation_complete(
        self, upstream: str, params: types.ElicitCompleteNotificationParams, *, during_call: bool
    ) -> None:
        if self.modern or not elicits_by_url(self.capabilities):
            return
        if not during_call:  # its request's stream is gone: on the session's own channel
            await self.session.elicitation_complete(upstream, params)
            return
        with anyio.move_on_after(SEND_TIMEOUT):
            await self.server_session.send_notification(
                types.ElicitCompleteNotification(params=params), related_request_id=self.request_id
            )

    async def ask(self, upstream: str, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        if (refused := refusal(self.session.modern, self.session.capabilities, request)) is not None:
            logger.warning(
                QUESTION_REFUSED,
                request.method,
                upstream,
                self.session_id,
                refused.message,
                extra={"peer": upstream},
            )
            return refused
        logger.info("relaying %s from %s to session %s", request.method, upstream, self.session_id)
        # Its own scope, which ``withdraw_questions`` cancels: the SDK then tells the client.
        with anyio.CancelScope() as asking:
            self.questions[asking] = ended = anyio.Event()
            try:
                return await self.server_session.send_request(
                    request,  # pyright: ignore[reportArgumentType]
                    result_type(request),
                    metadata=ServerMessageMetadata(related_request_id=self.request_id),
                )
            except MCPError as exc:
                return exc.error
            finally:
                del self.questions[asking]
                ended.set()
        return types.ErrorData(code=types.INVALID_REQUEST, message=_WITHDRAWN)

    async def withdraw_questions(self) -> None:
        """Withdraw what the client is still being asked for this request, which has ended:
        each question cancelled at the client (``notifications/cancelled``, as an upstream's SDK
        cancels its own when its handler is), before the request's answer ends its stream, the
        only way the cancel reaches an HTTP client. Before, a cancelled call left its client
        answering a question of a call that no longer was (a dialog open, its model sampling).
        Within ``SEND_TIMEOUT``; nothing awaited when nothing is asked (nearly always)."""
        if not self.questions:
            return
        asked = list(self.questions.items())
        with anyio.CancelScope(shield=True), anyio.move_on_after(SEND_TIMEOUT):
            for asking, ended in asked:
                asking.cancel()
                await ended.wait()
