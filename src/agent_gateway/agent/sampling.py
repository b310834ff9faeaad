"""A LangChain chat model that is the calling client's own model, reached through MCP sampling.

With a client that declares ``sampling.tools``, tools travel in the ``sampling/createMessage``
request and tool calls come back as ``tool_use`` blocks. Otherwise the JSON envelope protocol
(``envelope``) carries them in plain text, with bounded corrections of malformed replies.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolCall, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict

from agent_gateway.agent import envelope
from agent_gateway.agent.asking import Asker
from agent_gateway.errors import BadModelOutput, ModelFailed

logger = logging.getLogger(__name__)

Blocks = list[types.SamplingMessageContentBlock]
MAX_REQUEST_BYTES = 768 * 1024
"""Bytes of JSON of one ``sampling/createMessage`` request's params: the run ends with why
instead of sending more. The view is bounded in (approximate) tokens, not bytes: four tool
results of 100,000 non-ASCII characters made a 1.6 MB request, which the official client
could not read (its event past 1 MiB): the client's ``ask_agent`` call failed with no answer."""


class SamplingChatModel(BaseChatModel):
    """The calling client's model; async only (the gateway never calls it sync)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    asker: Asker
    """Asks the client (a request on its session, or a pause of the run for a modern client)."""
    with_tools: bool
    """Whether the client takes tools in sampling requests (``sampling.tools``)."""
    max_tokens: int = 4096
    temperature: float | None = None
    timeout: float = 120.0

    @property
    def _llm_type(self) -> str:
        return "mcp-sampling"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=[_mcp_tool(t) for t in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise ModelFailed("the sampling model answers only in async runs")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        tools: list[types.Tool] = kwargs.get("tools") or []
        if tools and self.with_tools:
            reply = await self._turn_with_tools(messages, tools)
        elif tools:
            reply = await self._turn_with_envelope(messages, tools)
        else:
            system, turns = _text_turns(messages)
            reply = _answer(await self._sample(system, turns, None))
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _turn_with_tools(self, messages: list[BaseMessage], tools: list[types.Tool]) -> AIMessage:
        system, turns = _tool_turns(messages)
        result = await self._sample(system, turns, tools)
        blocks = _blocks(result)
        text = "".join(b.text for b in blocks if isinstance(b, types.TextContent))
        calls = [
            ToolCall(name=b.name, args=b.input, id=b.id)
            for b in blocks
            if isinstance(b, types.ToolUseContent)
        ]
        return AIMessage(content=text, tool_calls=calls, response_metadata={"model_name": result.model})

    async def _turn_with_envelope(self, messages: list[BaseMessage], tools: list[types.Tool]) -> AIMessage:
        system, turns = _text_turns(messages)
        system = "\n\n".join(p for p in (system, envelope.instructions(tools)) if p)
        problem = ""
        for _ in range(envelope.MAX_CORRECTIONS + 1):
            result = await self._sample(system, turns, None)
            text = "".join(b.text for b in _blocks(result) if isinstance(b, types.TextContent))
            try:
                parsed = envelope.parse(text)
            except envelope.EnvelopeError as exc:
                problem = str(exc)
                logger.info("sampling reply rejected (%s); correcting", problem)
                turns += [_turn("assistant", text), _turn("user", envelope.correction(problem))]
                continue
            return _from_envelope(parsed, result.model)
        raise BadModelOutput(
            f"the client's model did not answer with a valid JSON envelope after "
            f"{envelope.MAX_CORRECTIONS} corrections: {problem}"
        )

    async def _sample(
        self, system: str | None, turns: list[types.SamplingMessage], tools: list[types.Tool] | None
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools:
        params = types.CreateMessageRequestParams(
            messages=turns,
            system_prompt=system,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            tools=tools,
            tool_choice=types.ToolChoice(mode="auto") if tools else None,
        )
        size = len(params.model_dump_json(by_alias=True, exclude_none=True).encode())
        if size > MAX_REQUEST_BYTES:
            raise ModelFailed(
                f"the request to the client's model (sampling) would be {size:,} bytes of JSON, more "
                f"than the {MAX_REQUEST_BYTES:,} a client is sent at once; ask for less at once"
            )
        answers = await self.asker.ask({"model": types.CreateMessageRequest(params=params)}, self.timeout)
        answer = answers.get("model")
        if answer is None:
            raise ModelFailed(f"the client's model (sampling) did not answer within {self.timeout:g}s")
        if isinstance(answer, types.ErrorData):
            raise ModelFailed(f"the client's model (sampling) failed: {answer.message}")
        if not isinstance(answer, types.CreateMessageResult | types.CreateMessageResultWithTools):
            raise BadModelOutput(f"the client answered sampling with {type(answer).__name__}")
        return answer


def _mcp_tool(spec: dict[str, Any]) -> types.Tool:
    """A tool the graph bound (OpenAI function format) as a sampling request carries it."""
    function = spec["function"]
    return types.Tool(
        name=function["name"], description=function.get("description"), input_schema=function["parameters"]
    )


def _blocks(result: types.CreateMessageResult | types.CreateMessageResultWithTools) -> Blocks:
    content = result.content
    return list(content) if isinstance(content, list) else [content]


def _answer(result: types.CreateMessageResult | types.CreateMessageResultWithTools) -> AIMessage:
    text = "".join(b.text for b in _blocks(result) if isinstance(b, types.TextContent))
    return AIMessage(content=text, response_metadata={"model_name": result.model})


def _from_envelope(parsed: envelope.Envelope, model: str) -> AIMessage:
    meta = {"model_name": model}
    if isinstance(parsed, envelope.FinalEnvelope):
        return AIMessage(content=parsed.answer, response_metadata=meta)
    call = ToolCall(name=parsed.tool, args=parsed.arguments, id=f"call_{uuid.uuid4().hex[:12]}")
    return AIMessage(content="", tool_calls=[call], response_metadata=meta)


def _turn(role: types.Role, text: str) -> types.SamplingMessage:
    return types.SamplingMessage(role=role, content=types.TextContent(type="text", text=text))


def _system(messages: list[BaseMessage]) -> str | None:
    return "\n\n".join(m.text for m in messages if isinstance(m, SystemMessage)) or None


def _tool_turns(messages: list[BaseMessage]) -> tuple[str | None, list[types.SamplingMessage]]:
    """Messages in the sampling-with-tools shape: calls as ``tool_use``, results as ``tool_result``.

    Each turn's blocks are gathered first and made a message once: a message rebuilt for each
    result joining it validated its whole list again each time (10,000 results: 90 s)."""
    turns: list[_Turn] = []
    for message in messages:
        blocks = _tool_blocks(message)
        if not blocks:
            continue
        results = isinstance(message, ToolMessage)
        role: types.Role = "assistant" if isinstance(message, AIMessage) else "user"
        last = turns[-1] if turns else None
        # The results of one turn's calls travel together, in one user message of results only;
        # user text after user text (a run that paused and was never resumed) joins it.
        joins = last is not None and (
            last.results if results else role == "user" == last.role and not last.results
        )
        if last is not None and joins:
            last.blocks.extend(blocks)
        else:
            turns.append(_Turn(role, blocks, results))
    return _system(messages), [types.SamplingMessage(role=t.role, content=t.blocks) for t in turns]


@dataclass
class _Turn:
    """One sampling message being gathered: its role, blocks, and whether they are all results."""

    role: types.Role
    blocks: Blocks
    results: bool


def _tool_blocks(message: BaseMessage) -> Blocks:
    if isinstance(message, ToolMessage):
        text = types.TextContent(type="text", text=message.text)
        return [
            types.ToolResultContent(
                tool_use_id=message.tool_call_id, content=[text], is_error=message.status == "error"
            )
        ]
    if isinstance(message, AIMessage):
        blocks: Blocks = [types.TextContent(type="text", text=message.text)] if message.text else []
        calls = [
            types.ToolUseContent(id=c["id"] or c["name"], name=c["name"], input=c["args"])
            for c in message.tool_calls
        ]
        # Unparsable calls were answered with an error result, which needs its tool_use.
        calls += [
            types.ToolUseContent(id=c["id"], name=c["name"] or "unknown", input={})
            for c in message.invalid_tool_calls
            if c["id"]
        ]
        return [*blocks, *calls]
    if isinstance(message, HumanMessage):
        return [types.TextContent(type="text", text=message.text)]
    return []


def _text_turns(messages: list[BaseMessage]) -> tuple[str | None, list[types.SamplingMessage]]:
    """Messages as plain text turns, tool calls and results written as the envelope shows them."""
    turns: list[types.SamplingMessage] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            continue
        role: types.Role = "assistant" if isinstance(message, AIMessage) else "user"
        text = _as_text(message)
        last = turns[-1] if turns else None
        if last is not None and last.role == role and isinstance(last.content, types.TextContent):
            turns[-1] = _turn(role, f"{last.content.text}\n\n{text}")
        else:
            turns.append(_turn(role, text))
    return _system(messages), turns


def _as_text(message: BaseMessage) -> str:
    if isinstance(message, AIMessage) and message.tool_calls:
        return "\n".join(envelope.render_call(c["name"], c["args"]) for c in message.tool_calls)
    if isinstance(message, ToolMessage):
        return envelope.render_result(message.name or "tool", message.text, message.status == "error")
    return message.text
