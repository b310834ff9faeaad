"""LangChain integrations' internals the gateway uses (verified against langchain-anthropic 1.7)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported by agent/models.py only when a provider needs it: it takes ~1 s
    from langchain_anthropic import ChatAnthropic


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
