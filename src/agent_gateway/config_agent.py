"""``agent``: the settings of ``ask_agent``, the gateway's own agent, and of its model."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from agent_gateway.config_base import FieldProblem, Seconds, scheme_of
from agent_gateway.config_base import Strict as _Strict
from agent_gateway.config_store import MemoryConfig
from agent_gateway.naming import AgentName

Provider = Literal["openai", "anthropic", "sampling"]


class ModelConfig(_Strict):
    """The model behind ``ask_agent``: an API provider, or the calling client's own (sampling)."""

    provider: Provider
    model: str | None = None
    base_url: str | None = None
    # repr=False: a secret; it reaches the provider's client and nothing else.
    api_key: str | None = Field(default=None, repr=False)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int = Field(default=4096, gt=0)
    timeout: Seconds = 120.0
    max_retries: int = Field(default=2, ge=0, le=10)

    @model_validator(mode="after")
    def _complete(self) -> ModelConfig:
        if self.provider == "sampling":
            return self
        if not self.model:
            raise FieldProblem(("agent", "model", "model"), f"provider {self.provider!r} needs a model name")
        if not self.api_key:
            raise FieldProblem(
                ("agent", "model", "api_key"),
                f"provider {self.provider!r} needs an API key (e.g. api_key: ${{{_KEY_VARIABLE[self.provider]}}})",
            )
        if self.base_url is not None and not re.match(r"^https?://", self.base_url):
            raise FieldProblem(
                ("agent", "model", "base_url"),
                f"must start with http:// or https://, not {scheme_of(self.base_url)}",
            )
        return self


_KEY_VARIABLE = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


class AgentToolsConfig(_Strict):
    """Which catalog tools the agent may call (globs over public names)."""

    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()


class AgentConfig(_Strict):
    """``ask_agent``: the gateway's own LangGraph agent over the catalog."""

    enabled: bool = True
    name: AgentName = "ask_agent"
    model: ModelConfig | None = None
    """None: the calling client's model through sampling, when it offers sampling."""
    instructions: str = (
        "You are agent-gateway's tool agent. Answer the user's request, calling the available "
        "tools when they help. Call independent tools together in one turn. Be concise."
    )
    max_steps: int = Field(default=10, ge=1, le=100)
    max_tools: int = Field(default=40, ge=2, le=128)
    """Tools bound to one model call. When the client may use more, a run binds the ones most
    relevant to the request, plus ``search_tools`` to find others (model APIs refuse over 128)."""
    max_context_tokens: int = Field(default=32_000, ge=256)
    tools: AgentToolsConfig = Field(default_factory=AgentToolsConfig)
    require_approval: tuple[str, ...] = ()
    """Tools (globs over public names) that run only after the client approves (elicitation)."""
    approve_destructive: Literal["ask", "auto"] = "ask"
    """``ask``: tools annotated ``destructiveHint: true`` need approval too."""
    approval_timeout: Seconds = 300.0
    """How long the client has to answer an approval request before the tool is refused."""
    run_timeout: Seconds = 900.0
    """How long one ``ask_agent`` request may run in all (a modern client's paused run: each of
    its rounds): ten turns of a slow model, each retried, with tools and approvals between,
    could hold a run, its thread and its upstream calls for over an hour."""
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
