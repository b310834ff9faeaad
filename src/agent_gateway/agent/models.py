"""One factory for the agent's chat model: an OpenAI-compatible endpoint, Anthropic, or the
calling client's own model through MCP sampling.

API models are built once, at start-up, so a bad provider setting fails there; a sampling
model is built per run, bound to the client that called.
"""

from __future__ import annotations

from typing import Protocol

import anyio
import httpx2
from langchain_core.language_models import BaseChatModel
from pydantic import SecretStr, ValidationError

from agent_gateway.agent.asking import Asker
from agent_gateway.agent.provider_http import event_hooks
from agent_gateway.agent.sampling import SamplingChatModel
from agent_gateway.compat.langchain import anthropic_client_params, model_type, openai_chat, use_async_client
from agent_gateway.config import ModelConfig
from agent_gateway.downstream.caller import Caller
from agent_gateway.errors import ConfigError, ModelUnavailable

_HOW_TO_CONFIGURE = (
    "no model is configured for the agent and this client does not offer sampling. Either connect "
    "with a client that declares the sampling capability (its own model is then used), or set "
    "agent.model in gateway.yaml, e.g. {provider: openai, model: gpt-4o-mini, api_key: ${OPENAI_API_KEY}}"
)


class _Closable(Protocol):
    async def aclose(self) -> None: ...


class ModelSource:
    """Where each run's chat model comes from."""

    def __init__(self, config: ModelConfig | None, override: BaseChatModel | None = None) -> None:
        """Raises ``ConfigError`` when the provider refuses the configured settings."""
        self._config = config
        self._http: list[_Closable] = []
        self._fixed = override if override is not None else _api_model(config, self._http)
        self._deadline: float | None = None
        if override is None and self._fixed is not None and config is not None:  # an API model
            self._deadline = config.timeout * (config.max_retries + 1)

    async def aclose(self) -> None:
        """Close the provider's HTTP connections (the SDKs would leave them to the GC)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
            for client in self._http:
                await client.aclose()

    @property
    def secret(self) -> str | None:
        """The configured API key, for scrubbing from error messages."""
        return self._config.api_key if self._config is not None else None

    @property
    def deadline(self) -> float | None:
        """Seconds one call of the configured API model may take, its SDK's retries and their
        waits included (None: the client's model, whose every request is bounded, or a test's).

        The SDK's ``timeout`` bounds each read, not a reply: an endpoint sending a byte a second
        held a run for ever, and its retries honour a ``Retry-After`` of up to two minutes each
        (240 s with ``timeout: 10``)."""
        return self._deadline

    @property
    def label(self) -> str:
        """The configured model's name, until a reply names the model that answered."""
        if self._fixed is not None:
            return (
                getattr(self._fixed, "model_name", None)
                or getattr(self._fixed, "model", None)
                or model_type(self._fixed)
            )
        return "client model (sampling)"

    @property
    def provider(self) -> str:
        """The provider's name for spans (``gen_ai.provider.name``)."""
        if self._config is not None and self._config.provider != "sampling":
            return self._config.provider
        return "mcp.sampling" if self._fixed is None else model_type(self._fixed)

    def for_run(self, caller: Caller | None, asker: Asker | None) -> BaseChatModel:
        """The model for one run by ``caller`` (None: a run with no MCP client, e.g. the CLI),
        asking the client's model through ``asker`` when that is the model.

        Raises:
            ModelUnavailable: sampling is needed and the caller cannot provide it.
        """
        if self._fixed is not None:
            return self._fixed
        if caller is None or asker is None:
            raise ModelUnavailable(
                "the agent's model is the calling client's (sampling), and this run has no MCP client; "
                "set agent.model to an API provider to run it from the command line"
            )
        caps = caller.capabilities
        if caps is None or caps.sampling is None:
            if self._config is not None:  # provider: sampling, chosen on purpose
                raise ModelUnavailable(
                    "agent.model.provider is 'sampling' (the calling client's own model), and this "
                    "client does not declare the sampling capability"
                )
            raise ModelUnavailable(f"agent: {_HOW_TO_CONFIGURE}")
        config = self._config
        return SamplingChatModel(
            asker=asker,
            with_tools=caps.sampling.tools is not None,
            max_tokens=config.max_tokens if config is not None else 4096,
            temperature=config.temperature if config is not None else None,
            timeout=config.timeout if config is not None else 120.0,
        )


def _api_model(config: ModelConfig | None, owned: list[_Closable]) -> BaseChatModel | None:
    if config is None or config.provider == "sampling":
        return None
    # ModelConfig has checked both.
    assert config.model is not None
    assert config.api_key is not None
    try:
        if config.provider == "openai":
            return _openai(config, config.model, config.api_key, owned)
        return _anthropic(config, config.model, config.api_key, owned)
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]) for e in exc.errors(include_url=False))
        raise ConfigError(f"agent.model: {config.provider} refuses these settings: {reasons}") from None
    except httpx2.InvalidURL as exc:  # the provider's SDK parses base_url as it is built
        raise ConfigError(f"agent.model.base_url: {config.base_url!r} is not a URL: {exc}") from None


# Each provider's SDK is imported only when that provider is configured: together they add
# over a second to every gateway start, IDE launches over stdio included.


def _openai(config: ModelConfig, model: str, key: str, owned: list[_Closable]) -> BaseChatModel:
    import openai

    http = openai.DefaultAsyncHttpxClient(timeout=config.timeout, event_hooks=event_hooks())
    owned.append(http)
    return openai_chat(
        http_async_client=http,
        model=model,
        base_url=config.base_url,
        api_key=SecretStr(key),
        temperature=config.temperature,
        max_completion_tokens=config.max_tokens,
        timeout=config.timeout,
        max_retries=config.max_retries,
        stream_usage=True,
    )


def _anthropic(config: ModelConfig, model: str, key: str, owned: list[_Closable]) -> BaseChatModel:
    import anthropic
    from langchain_anthropic import ChatAnthropic

    chat = ChatAnthropic(
        model_name=model,
        base_url=config.base_url,
        api_key=SecretStr(key),
        temperature=config.temperature,
        max_tokens_to_sample=config.max_tokens,
        timeout=config.timeout,
        max_retries=config.max_retries,
        stop=None,
    )
    # ChatAnthropic takes no HTTP client, and its default is shared and never closed: give it
    # the SDK client it would build, over a connection pool the gateway owns and closes.
    http = anthropic.DefaultAsyncHttpxClient(timeout=config.timeout, event_hooks=event_hooks())
    owned.append(http)
    params = anthropic_client_params(chat)
    use_async_client(chat, anthropic.AsyncClient(**params, http_client=http))
    return chat
