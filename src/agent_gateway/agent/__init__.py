"""``ask_agent``: the gateway's own LangGraph agent over the federated catalog."""

from agent_gateway.agent.runner import AgentRequest, AgentRunner, RunOutcome
from agent_gateway.agent.tool import AgentTool

__all__ = ["AgentRequest", "AgentRunner", "AgentTool", "RunOutcome"]
