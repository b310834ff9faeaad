"""A scripted LangChain chat model: the real graph runs, the model's turns are written by the test.

LangChain's fake chat models neither bind tools nor keep tool calls, so this one returns
itself from ``bind_tools`` and replies from a script (or a function of what it was sent).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolCall
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

Reply = AIMessage | BaseException | Callable[[list[BaseMessage]], Awaitable[AIMessage]]
USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(name=name, args=arguments, id=f"call_{uuid.uuid4().hex[:8]}")


def calls(*tool_calls: ToolCall) -> AIMessage:
    """A model turn that calls these tools."""
    return AIMessage(content="", tool_calls=list(tool_calls), usage_metadata=USAGE)  # type: ignore[arg-type]


def answer(text: str) -> AIMessage:
    """A model turn that answers."""
    return AIMessage(content=text, usage_metadata=USAGE)  # type: ignore[arg-type]


class ScriptedChatModel(BaseChatModel):
    """Replies with ``script`` in order, or with ``respond(messages)`` when given."""

    script: list[Any] = Field(default_factory=list)
    """Replies in order: an AIMessage, an exception to raise, or an async function of the messages."""
    respond: Callable[[list[BaseMessage]], AIMessage] | None = None
    model_name: str = "scripted"
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    """Each model call's messages, as the graph sent them."""
    tools: list[Any] = Field(default_factory=list)
    bound: list[list[str]] = Field(default_factory=list)
    """The names of the tools bound for each model call that bound any, in order."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        self.tools = list(tools)
        self.bound.append([t["function"]["name"] for t in tools if isinstance(t, dict)])
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise AssertionError("the gateway calls models asynchronously")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        if self.respond is not None:
            return _result(self.respond(messages), self.model_name)
        if not self.script:
            raise AssertionError("the script has no more turns")
        reply: Reply = self.script.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            reply = await reply(messages)
        return _result(reply, self.model_name)


def _result(message: AIMessage, model: str) -> ChatResult:
    message = message.model_copy(update={"response_metadata": {"model_name": model}})
    return ChatResult(generations=[ChatGeneration(message=message)])
