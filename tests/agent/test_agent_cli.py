"""``agent-gateway ask``: the agent run in-process from the command line, as a user runs it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import yaml

from tests.agent.model_apis import Turn, openai_api
from tests.support import gateway_env, serving

BOUND = 60.0


def write_config(tmp_path: Path, base: str) -> Path:
    config = {
        "upstreams": {"notes": {"command": sys.executable, "args": ["-m", "agent_gateway.demo_server"]}},
        "agent": {
            "model": {
                "provider": "openai",
                "model": "gpt-test",
                "base_url": f"{base}/v1",
                "api_key": "${TEST_KEY}",
                "max_retries": 0,
            },
            "memory": {"path": str(tmp_path / "memory.sqlite")},
        },
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def run_ask(path: Path, *args: str) -> Any:
    command = ["agent-gateway", "--log-level", "warning", "ask", "-c", str(path), *args]
    with anyio.fail_after(BOUND):
        return await anyio.run_process(command, env={**gateway_env(), "TEST_KEY": "sk-cli"}, check=False)


async def test_ask_streams_each_step_then_prints_the_answer(tmp_path: Path) -> None:
    app, api = openai_api(
        [Turn(calls=[("notes__add_note", {"text": "buy milk"})]), Turn(text="Saved as note 1.")]
    )
    async with serving(app) as base:
        done = await run_ask(write_config(tmp_path, base), "Note that I must buy milk.")
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    lines = out.splitlines()
    assert lines[0] == "[step 1] asking the model"
    assert lines[1] == '  -> notes__add_note {"text": "buy milk"}'
    assert lines[2].startswith("  <- notes__add_note ok (")
    assert lines[3] == "[step 2] asking the model"
    assert lines[-1] == "Saved as note 1."
    assert api.requests[1]["messages"][-1]["content"] == '{"number":1}'


async def test_ask_json_prints_the_structured_record_and_a_failed_run_exits_non_zero(tmp_path: Path) -> None:
    app, _ = openai_api([Turn(text="Hello."), Turn(status=500, error="overloaded")])
    async with serving(app) as base:
        path = write_config(tmp_path, base)
        done = await run_ask(path, "Hi", "--json", "--conversation", "c1")
        failed = await run_ask(path, "Hi again", "--json", "--conversation", "c1")
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert (result["answer"], result["thread_id"], result["steps"], result["model"]) == (
        "Hello.",
        "c1",
        1,
        "gpt-test",
    )
    assert "[step 1] asking the model" in done.stderr.decode()
    assert failed.returncode == 1
    record = json.loads(failed.stdout)
    assert record["answer"] is None
    assert record["error"] == "the model call failed: OpenAIAPIError: Error code: 500 - overloaded"
