"""Harvest the tool lists of real MCP servers for the tool-search benchmark.

Installs each pinned package from the npm registry or PyPI into a cache outside the repository
(`~/.cache/agent-gateway-bench`, or `$AGENT_GATEWAY_BENCH_CACHE`), starts it over stdio with dummy
credentials that point at a closed loopback port (127.0.0.1:9), lists its tools with the official
`mcp` client and writes them, as listed, to `bench/data/tool_search/tools.json`.

    .venv/bin/python bench/harvest_tools.py                 # every server (a few minutes)
    .venv/bin/python bench/harvest_tools.py --only gitlab   # re-harvest some, keep the rest

The benchmark reads only the committed JSON; nothing here runs at benchmark time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

Registry = Literal["npm", "pypi"]

OUT = Path(__file__).resolve().parent / "data" / "tool_search" / "tools.json"
CACHE = Path(os.environ.get("AGENT_GATEWAY_BENCH_CACHE", Path.home() / ".cache" / "agent-gateway-bench"))
LIST_TIMEOUT_S = 150
TOOL_KEYS = ("name", "title", "description", "inputSchema", "annotations")
# Nothing listens on the discard port: a server that reaches out at start-up fails fast, locally.
DEAD = "127.0.0.1:9"


@dataclass(frozen=True)
class Server:
    """One MCP server to harvest: where it comes from and how to start it offline."""

    name: str
    package: str
    version: str
    registry: Registry
    domain: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict[str, str])
    python: str = "3.11"  # pypi only: the interpreter its venv is made with
    pip_extra: tuple[str, ...] = ()  # pypi only: extra requirements, e.g. a compatible SDK


def npm(name: str, spec: str, domain: str, command: str, *args: str, **env: str) -> Server:
    package, _, version = spec.rpartition("@")
    return Server(name, package, version, "npm", domain, command, args, env)


def pypi(
    name: str,
    spec: str,
    domain: str,
    command: str,
    *args: str,
    python: str = "3.11",
    pip_extra: tuple[str, ...] = (),
    **env: str,
) -> Server:
    package, _, version = spec.partition("==")
    return Server(name, package, version, "pypi", domain, command, args, env, python, pip_extra)


# `{work}` in an argument or variable is the harvest's scratch directory (see `scratch_dir`).
# fmt: off
SERVERS: tuple[Server, ...] = (
    # code hosting and issue trackers
    npm("github", "@modelcontextprotocol/server-github@2025.4.8", "code hosting", "mcp-server-github",
        GITHUB_PERSONAL_ACCESS_TOKEN="ghp_dummy"),
    npm("gitlab", "@zereight/mcp-gitlab@2.1.64", "code hosting", "zereight-mcp-gitlab",
        GITLAB_PERSONAL_ACCESS_TOKEN="glpat-dummy", GITLAB_API_URL=f"http://{DEAD}/api/v4",
        GITLAB_TOOLSETS="all", GITLAB_DISABLE_VERSION_CHECK="true"),
    npm("linear", "@tacticlaunch/mcp-linear@1.4.3", "issue tracker", "mcp-linear",
        LINEAR_API_TOKEN="lin_api_dummy"),
    pypi("atlassian", "mcp-atlassian==0.23.1", "issue tracker", "mcp-atlassian", TOOLSETS="all",
         JIRA_URL=f"http://{DEAD}", JIRA_USERNAME="bench@example.com", JIRA_API_TOKEN="dummy",
         CONFLUENCE_URL=f"http://{DEAD}/wiki", CONFLUENCE_USERNAME="bench@example.com",
         CONFLUENCE_API_TOKEN="dummy"),
    npm("shortcut", "@shortcut/mcp@0.25.0", "issue tracker", "mcp-server-shortcut",
        SHORTCUT_API_TOKEN="dummy"),
    npm("monday", "@mondaydotcomorg/monday-api-mcp@3.3.0", "project management", "mcp-server-monday-api",
        "-t", "dummy"),
    # chat and messaging
    npm("slack", "@modelcontextprotocol/server-slack@2025.4.25", "chat", "mcp-server-slack",
        SLACK_BOT_TOKEN="xoxb-dummy", SLACK_TEAM_ID="T00000000"),
    npm("discord", "mcp-discord@1.3.4", "chat", "mcp-discord", DISCORD_TOKEN="dummy"),
    pypi("zulip", "zulipchat-mcp==0.7.6", "chat", "zulipchat-mcp", "--extended-tools",
         ZULIP_EMAIL="bot@example.com", ZULIP_API_KEY="dummy", ZULIP_SITE=f"http://{DEAD}"),
    npm("twilio", "@twilio-alpha/mcp@0.7.0", "messaging (SMS, voice)", "twilio-mcp-server",
        "AC00000000000000000000000000000000/SK00000000000000000000000000000000:dummy", "--services",
        "twilio_api_v2010"),
    npm("line", "@line/line-bot-mcp-server@0.5.0", "messaging (LINE)", "line-bot-mcp-server",
        CHANNEL_ACCESS_TOKEN="dummy", DESTINATION_USER_ID="U00000000000000000000000000000000"),
    npm("ms365", "@softeria/ms-365-mcp-server@0.155.0", "office suite (mail, calendar, Teams, files)",
        "ms-365-mcp-server", "--org-mode"),
    pypi("google_workspace", "workspace-mcp==2.2.1", "office suite (mail, calendar, Drive, Docs, Sheets)",
         "workspace-mcp", "--single-user", "--tool-tier", "complete",
         GOOGLE_OAUTH_CLIENT_ID="dummy.apps.googleusercontent.com", GOOGLE_OAUTH_CLIENT_SECRET="dummy"),
    npm("google_calendar", "@cocal/google-calendar-mcp@2.6.3", "calendar", "google-calendar-mcp",
        GOOGLE_OAUTH_CREDENTIALS="{work}/gcp-oauth.keys.json"),
    # cloud providers
    npm("azure", "@azure/mcp@2.0.5", "cloud provider", "azmcp", "server", "start", "--mode", "all",
        AZURE_MCP_COLLECT_TELEMETRY="false", DOTNET_CLI_TELEMETRY_OPTOUT="1"),
    npm("digitalocean", "@digitalocean/mcp@1.0.70", "cloud provider", "mcp", "--digitalocean-api-endpoint",
        f"http://{DEAD}", "--services",
        "apps,droplets,accounts,networking,databases,doks,docr,spaces,volumes,insights,marketplace,functions,nfs,docs",
        DIGITALOCEAN_API_TOKEN="dop_v1_dummy"),
    npm("cloudflare", "@cloudflare/mcp-server-cloudflare@0.2.0", "cloud provider", "mcp-server-cloudflare",
        "run", "0000000000000000000000000000000", CLOUDFLARE_API_TOKEN="dummy"),
    # databases
    npm("supabase", "@supabase/mcp-server-supabase@0.13.0", "database", "mcp-server-supabase",
        "--access-token", "sbp_dummy", "--api-url", f"http://{DEAD}", "--features",
        "account,database,debugging,development,functions,branching,storage"),
    npm("mongodb", "mongodb-mcp-server@3.0.4", "database", "mongodb-mcp-server",
        MDB_MCP_TELEMETRY="disabled"),
    npm("postgres", "@modelcontextprotocol/server-postgres@0.6.2", "database", "mcp-server-postgres",
        f"postgresql://bench:dummy@{DEAD}/bench"),
    pypi("sqlite", "mcp-server-sqlite==2025.4.25", "database", "mcp-server-sqlite", "--db-path",
         "{work}/bench.sqlite", pip_extra=("mcp<2",)),
    pypi("clickhouse", "mcp-clickhouse==0.7.0", "database", "mcp-clickhouse", CLICKHOUSE_HOST="127.0.0.1",
         CLICKHOUSE_PORT="9", CLICKHOUSE_USER="bench", CLICKHOUSE_PASSWORD="dummy"),
    pypi("redis", "redis-mcp-server==0.5.1", "database", "redis-mcp-server", REDIS_HOST="127.0.0.1",
         REDIS_PORT="9"),
    npm("airtable", "airtable-mcp-server@1.14.0", "database", "airtable-mcp-server",
        AIRTABLE_API_KEY="pat_dummy"),
    npm("elasticsearch", "@elastic/mcp-server-elasticsearch@0.3.1", "search engine",
        "mcp-server-elasticsearch", ES_URL=f"http://{DEAD}", ES_API_KEY="dummy"),
    npm("pinecone", "@pinecone-database/mcp@0.3.0", "vector database", "pinecone-mcp",
        PINECONE_API_KEY="dummy"),
    # browsers and the web
    npm("playwright", "@playwright/mcp@0.0.83", "browser automation", "playwright-mcp", "--headless",
        "--caps", "vision,pdf,devtools"),
    npm("puppeteer", "@modelcontextprotocol/server-puppeteer@2025.5.12", "browser automation",
        "mcp-server-puppeteer"),
    npm("chrome_devtools", "chrome-devtools-mcp@1.11.0", "browser automation", "chrome-devtools-mcp",
        "--headless", "--no-usage-statistics", "--no-performance-crux"),
    pypi("fetch", "mcp-server-fetch==2026.10.24", "web fetch", "mcp-server-fetch"),
    npm("firecrawl", "firecrawl-mcp@3.26.0", "web scraping", "firecrawl-mcp", FIRECRAWL_API_KEY="fc-dummy",
        FIRECRAWL_API_URL=f"http://{DEAD}"),
    npm("brave_search", "@brave/brave-search-mcp-server@2.1.4", "web search", "brave-search-mcp-server",
        BRAVE_API_KEY="dummy"),
    # monitoring, incidents, CI
    pypi("pagerduty", "pagerduty-mcp==1.1.0", "incident response", "pagerduty-mcp", "--enable-write-tools",
         python="3.12", PAGERDUTY_USER_API_KEY="dummy", PAGERDUTY_API_HOST=f"http://{DEAD}"),
    npm("sentry", "@sentry/mcp-server@0.39.0", "error monitoring", "sentry-mcp", "--access-token=dummy",
        f"--host={DEAD}", "--insecure-http", "--all-skills"),
    pypi("grafana", "mcp-grafana==2.1.1", "observability", "mcp-grafana", GRAFANA_URL=f"http://{DEAD}",
         GRAFANA_SERVICE_ACCOUNT_TOKEN="dummy"),
    npm("datadog", "@winor30/mcp-server-datadog@1.8.0", "observability", "mcp-server-datadog",
        DATADOG_API_KEY="dummy", DATADOG_APP_KEY="dummy", DATADOG_SITE=f"{DEAD}"),
    pypi("prometheus", "prometheus-mcp-server==1.6.2", "observability", "prometheus-mcp-server",
         PROMETHEUS_URL=f"http://{DEAD}"),
    npm("circleci", "@circleci/mcp-server-circleci@0.20.0", "CI/CD", "mcp-server-circleci",
        CIRCLECI_TOKEN="dummy", CIRCLECI_BASE_URL=f"http://{DEAD}"),
    pypi("jenkins", "mcp-jenkins==3.6.0", "CI/CD", "mcp-jenkins", JENKINS_URL=f"http://{DEAD}",
         JENKINS_USERNAME="bench", JENKINS_PASSWORD="dummy"),
    npm("kubernetes", "mcp-server-kubernetes@4.1.7", "container orchestration", "mcp-server-kubernetes",
        KUBECONFIG="{work}/kubeconfig"),
    npm("launchdarkly", "@launchdarkly/mcp-server@0.6.2", "feature flags", "mcp", "start", "--api-key",
        "dummy", "--server-url", f"http://{DEAD}"),
    npm("stripe", "@stripe/mcp@0.2.5", "payments", "mcp", "--tools=all", "--api-key=sk_test_dummy"),
    # docs, CRM, local tools
    npm("notion", "@notionhq/notion-mcp-server@2.5.2", "docs and wiki", "notion-mcp-server",
        NOTION_TOKEN="ntn_dummy"),
    npm("hubspot", "@hubspot/mcp-server@0.4.0", "CRM", "mcp-hubspot", PRIVATE_APP_ACCESS_TOKEN="dummy",
        HUBSPOT_ACCESS_TOKEN="dummy"),
    npm("filesystem", "@modelcontextprotocol/server-filesystem@2026.8.31", "filesystem",
        "mcp-server-filesystem", "{work}"),
    npm("desktop_commander", "@wonderwhy-er/desktop-commander@0.2.52", "terminal and files",
        "desktop-commander"),
    npm("memory", "@modelcontextprotocol/server-memory@2026.8.31", "memory (knowledge graph)",
        "mcp-server-memory", MEMORY_FILE_PATH="{work}/memory.jsonl"),
    pypi("git", "mcp-server-git==2026.10.19", "version control", "mcp-server-git", "--repository",
         "{work}/repo"),
    pypi("time", "mcp-server-time==2026.10.19", "time", "mcp-server-time", "--local-timezone", "UTC"),
)
# fmt: on

KUBECONFIG = f"""apiVersion: v1
kind: Config
clusters: [{{name: bench, cluster: {{server: "https://{DEAD}"}}}}]
contexts: [{{name: bench, context: {{cluster: bench, user: bench}}}}]
current-context: bench
users: [{{name: bench, user: {{token: dummy}}}}]
"""
GOOGLE_OAUTH_CLIENT = json.dumps(
    {"installed": {"client_id": "dummy", "client_secret": "dummy", "redirect_uris": ["http://localhost"]}}
)


class HarvestError(Exception):
    """A server could not be installed, started or listed."""


def slug(server: Server) -> str:
    return f"{server.package.removeprefix('@').replace('/', '+')}@{server.version}"


def run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with log.open("a") as out:
        done = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise HarvestError(f"{' '.join(cmd[:4])}… exited {done.returncode}; see {log}")


def install_npm(server: Server, log: Path) -> Path:
    """`npm install` the exact version; scripts are skipped (no browser or binary downloads)."""
    prefix = CACHE / "npm" / slug(server)
    binary = prefix / "node_modules" / ".bin" / server.command
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        spec = f"{server.package}@{server.version}"
        run(
            ["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error", spec],
            log,
            prefix,
        )
    manifest = json.loads((prefix / "node_modules" / server.package / "package.json").read_text())
    check_version(server, manifest["version"])
    return binary


def python_for(version: str) -> str:
    """An interpreter of that minor version: on PATH, else under pyenv."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "--version"], capture_output=True, check=False).returncode == 0:
        return found
    for candidate in sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}")):
        return str(candidate)
    raise HarvestError(f"no python{version} on this machine")


def install_pypi(server: Server, log: Path) -> Path:
    """A venv of its own per package, so that each keeps the dependencies it pins."""
    venv = CACHE / "pypi" / slug(server)
    binary = venv / "bin" / server.command
    if not binary.exists():
        run([python_for(server.python), "-m", "venv", str(venv)], log)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        run([*pip, f"{server.package}=={server.version}", *server.pip_extra], log)
    probe = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe, server.package], capture_output=True, text=True
    )
    check_version(server, out.stdout.strip())
    return binary


def check_version(server: Server, installed: str) -> None:
    if installed != server.version:
        raise HarvestError(f"{server.package}: pinned {server.version}, installed {installed!r}")


def scratch_dir() -> Path:
    """Files the servers are pointed at: a git repo, a kubeconfig and OAuth client that go nowhere, a HOME."""
    work = CACHE / "work"
    (work / "home").mkdir(parents=True, exist_ok=True)
    (work / "kubeconfig").write_text(KUBECONFIG)
    (work / "gcp-oauth.keys.json").write_text(GOOGLE_OAUTH_CLIENT)
    if not (work / "repo" / ".git").exists():
        subprocess.run(["git", "init", "-q", str(work / "repo")], check=True)
    return work


def launch_params(server: Server, binary: Path, work: Path) -> StdioServerParameters:
    fill = str(work)
    # A fixed hash seed: some Python servers build schema defaults by iterating over a set.
    env = {"HOME": str(work / "home"), "NO_COLOR": "1", "PYTHONHASHSEED": "0"}
    env |= {key: value.replace("{work}", fill) for key, value in server.env.items()}
    args = [arg.replace("{work}", fill) for arg in server.args]
    return StdioServerParameters(command=str(binary), args=args, env=env, cwd=work)


def tool_record(tool: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {key: dumped[key] for key in TOOL_KEYS if key in dumped}


async def list_tools(params: StdioServerParameters, errlog: Path) -> list[dict[str, Any]]:
    """Every page of `tools/list`, over the handshake-era protocol these servers speak."""
    tools: list[dict[str, Any]] = []
    with errlog.open("a") as err, anyio.fail_after(LIST_TIMEOUT_S):
        async with Client(stdio_client(params, errlog=err), mode="legacy") as client:
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                tools += [tool_record(tool) for tool in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    return tools


def harvest_one(server: Server, work: Path) -> dict[str, Any]:
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{server.name}.log"
    log.write_text("")
    install = install_npm if server.registry == "npm" else install_pypi
    binary = install(server, log)
    # The client logs what it cannot parse on a server's stdout (banners, log lines): into the same file.
    handler = logging.FileHandler(log)
    logging.getLogger("mcp").addHandler(handler)
    try:
        tools = anyio.run(list_tools, launch_params(server, binary, work), log)
    except Exception as exc:  # whatever a third-party server does wrong is that server's failure
        raise HarvestError(f"{server.name} could not be listed ({exc!r}); see {log}") from exc
    finally:
        logging.getLogger("mcp").removeHandler(handler)
        handler.close()
    if not tools:
        raise HarvestError(f"{server.name} listed no tools; see {log}")
    return {
        "name": server.name,
        "package": server.package,
        "version": server.version,
        "registry": server.registry,
        "domain": server.domain,
        "tools": tools,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help="comma-separated server names; the others keep their entries")
    parser.add_argument("--out", type=Path, default=OUT)
    options = parser.parse_args()
    only = set(options.only.split(",")) if options.only else None
    unknown = (only or set()) - {server.name for server in SERVERS}
    if unknown:
        parser.error(f"unknown server(s): {', '.join(sorted(unknown))}")
    # A server not harvested this run, or whose harvest fails, keeps its entry from the file.
    kept: dict[str, dict[str, Any]] = {}
    if options.out.exists():
        kept = {entry["name"]: entry for entry in json.loads(options.out.read_text())["servers"]}
    logging.getLogger("mcp").propagate = False
    work = scratch_dir()
    failed: list[str] = []
    started = time.monotonic()
    for server in SERVERS:
        if only is not None and server.name not in only:
            continue
        began = time.monotonic()
        try:
            kept[server.name] = harvest_one(server, work)
        except (HarvestError, OSError, TimeoutError) as exc:
            failed.append(server.name)
            previous = "its previous entry kept" if server.name in kept else "left out"
            print(f"{server.name:16} FAILED ({previous}): {exc}", file=sys.stderr)
            continue
        count = len(kept[server.name]["tools"])
        print(f"{server.name:16} {count:4} tools  {time.monotonic() - began:5.1f}s  {slug(server)}")
    servers = [kept[server.name] for server in SERVERS if server.name in kept]
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"servers": servers}, indent=1, ensure_ascii=False) + "\n")
    total = sum(len(entry["tools"]) for entry in servers)
    print(f"{len(servers)} servers, {total} tools -> {options.out} in {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
