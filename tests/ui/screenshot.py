"""Make docs/status-page.png: the shipped gateway.yaml served, a few calls and an agent run made,
the status page photographed in headless Chromium.

    .venv/bin/python -m tests.ui.screenshot [OUTPUT.png]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.session import ClientRequestContext
from playwright.async_api import async_playwright

from agent_gateway.config_files import load_config
from agent_gateway.http import build_app
from agent_gateway.server import Gateway
from tests.support import ROOT, serving

Reply = types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData


async def model(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> Reply:
    """A scripted 'IDE model' lending itself to ask_agent: one tool call, then an answer."""
    if len(params.messages) == 1:
        use = types.ToolUseContent(id="use-1", name="everything__get-sum", input={"a": 19, "b": 23})
        return types.CreateMessageResultWithTools(
            role="assistant", content=[use], model="ide", stop_reason="toolUse"
        )
    text = types.TextContent(type="text", text="19 + 23 = 42.")
    return types.CreateMessageResultWithTools(role="assistant", content=[text], model="ide")


async def main(output: Path) -> None:
    home = Path(tempfile.mkdtemp())
    shutil.copy(ROOT / "gateway.yaml", home / "gateway.yaml")
    gateway = Gateway(load_config(home / "gateway.yaml", {}))
    sampling = types.SamplingCapability(tools=types.SamplingToolsCapability())
    async with (
        gateway.running(),
        serving(build_app(gateway)) as base,
        Client(
            f"{base}/mcp", mode="legacy", sampling_callback=model, sampling_capabilities=sampling
        ) as client,
    ):
        await client.call_tool("notes__add", {"text": "ship the status page"})
        await client.call_tool("everything__get-sum", {"a": 2, "b": 3})
        await client.call_tool("memory__read_graph", {})
        await client.call_tool("everything__get-sum", {"a": "two"})
        await client.call_tool("ask_agent", {"query": "What is 19 + 23?"})
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(f"{base}/")
            await page.fill("#search", "memory")
            await page.wait_for_selector('#catalog[data-query="memory"]')  # the gateway's answer shown
            await page.screenshot(path=str(output), full_page=True)
            await browser.close()
    shutil.rmtree(home)


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "status-page.png"))
