"""LangChain integrations' internals the gateway uses (verified against langchain-anthropic 1.7
and langchain-openai 1.8)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported by agent/models.py only when a provider needs it: it takes ~1 s
    from langchain_anthropic import ChatAnthropic
    from langchain_core.language_models import BaseChatModel


def anthropic_client_params(chat: ChatAnthropic) -> dict[str, Any]:
    """The keyword arguments ``ChatAnthropic`` builds its SDK client with (key, base URL,
    headers, retries), so the gateway can build that client over a pool it owns."""
    params: dict[str, Any] = chat._client_params  # pyright: ignore[reportPrivateUsage]
    return params


def use_async_client(chat: ChatAnthropic, client: Any) -> None:
    """Make ``chat`` call through ``client`` (it takes no HTTP client of its own)."""
    object.__setattr__(chat, "_async_client", client)


def model_type(chat: Any) -> str:
    """A LangChain chat model's type name (``_llm_type``: what every integration defines,
    and what LangChain's own tracing labels a model with)."""
    return str(chat._llm_type)  # pyright: ignore[reportPrivateUsage]


def openai_chat(**options: Any) -> BaseChatModel:
    """``ChatOpenAI(**options)``, whose tool calls with arguments that are JSON but not an
    object (``[1, 2]``, ``"a"``) are invalid tool calls, as unparsable ones are: LangChain's
    parser passes such arguments on, and the message built of them fails validation, which
    ended the whole run where one bad call was meant to be told to the model. Its private
    ``_create_chat_result`` (``tests/test_compat.py`` checks it) is where a response becomes
    a message."""
    from langchain_core.messages import AIMessage
    from langchain_core.messages.tool import invalid_tool_call
    from langchain_openai import ChatOpenAI

    class ObjectArguments(ChatOpenAI):
        def _create_chat_result(self, response: Any, generation_info: dict[str, Any] | None = None) -> Any:
            invalid: list[dict[str, Any]] = []
            if not isinstance(response, dict) and hasattr(response, "model_dump"):
                response = response.model_dump(
                    exclude={"choices": {"__all__": {"message": {"parsed"}}}}, warnings=False
                )
            if isinstance(response, dict):
                invalid = _not_objects(response)  # pyright: ignore[reportUnknownArgumentType]
            result = super()._create_chat_result(response, generation_info)  # pyright: ignore[reportUnknownArgumentType]
            message = result.generations[0].message if invalid and result.generations else None
            if isinstance(message, AIMessage):
                message.invalid_tool_calls.extend(
                    invalid_tool_call(
                        name=c["name"],
                        args=c["arguments"],
                        id=c["id"],
                        error="its arguments are not a JSON object",
                    )
                    for c in invalid
                )
            return result

    return ObjectArguments(**options)


def _not_objects(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The first choice's tool calls whose arguments are JSON but not an object, taken out."""
    choices = response.get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return []
    kept: list[Any] = []
    taken: list[dict[str, Any]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str) and arguments and _not_object(arguments):
            taken.append({"name": function.get("name"), "arguments": arguments, "id": call.get("id")})  # pyright: ignore[reportOptionalMemberAccess]
        else:
            kept.append(call)
    if taken:
        message["tool_calls"] = kept or None  # pyright: ignore[reportOptionalSubscript]
    return taken


def _not_object(arguments: str) -> bool:
    try:
        value = json.loads(arguments)
    except ValueError:
        return False  # not JSON at all: LangChain's parser says so itself
    return bool(value) and not isinstance(value, dict)  # falsy values LangChain takes as {}
