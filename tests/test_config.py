"""gateway.yaml loading: interpolation, validation, error messages, mcpServers JSON."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

from agent_gateway.config_files import load_config, parse_config
from agent_gateway.errors import ConfigError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_minimal_file_loads_with_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "g.yaml", "upstreams:\n  a: {command: echo}\n"), {})
    assert config.server.host == "127.0.0.1"
    assert config.server.path == "/mcp"
    assert config.upstreams["a"].kind == "stdio"
    assert config.upstreams["a"].prefix is True


def test_variables_are_interpolated_with_defaults(tmp_path: Path) -> None:
    text = "upstreams:\n  s:\n    url: http://127.0.0.1:${PORT:-3101}/mcp\n    headers: {Authorization: 'Bearer ${TOKEN}'}\n"
    config = load_config(write(tmp_path, "g.yaml", text), {"TOKEN": "t0k"})
    assert config.upstreams["s"].url == "http://127.0.0.1:3101/mcp"
    assert config.upstreams["s"].headers == {"Authorization": "Bearer t0k"}
    assert config.upstreams["s"].kind == "streamable-http"
    # Set but empty (`export PORT=`) takes the default too, as in the shell: not a url with no port.
    config = load_config(write(tmp_path, "g.yaml", text), {"TOKEN": "t0k", "PORT": ""})
    assert config.upstreams["s"].url == "http://127.0.0.1:3101/mcp"


def test_a_missing_variable_names_file_field_and_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "g.yaml", "upstreams:\n  s:\n    url: http://x/${SEARCH_TOKEN}\n")
    with pytest.raises(
        ConfigError, match=r"g\.yaml: upstreams\.s\.url: environment variable SEARCH_TOKEN is not set"
    ):
        load_config(path, {})


def test_an_unknown_key_is_reported_with_its_path(tmp_path: Path) -> None:
    path = write(tmp_path, "g.yaml", "upstreams:\n  a: {command: echo, timout: 3}\n")
    with pytest.raises(ConfigError, match=r"g\.yaml: upstreams\.a\.timout: unknown key 'timout'"):
        load_config(path, {})


def test_a_wrong_type_is_reported_with_its_path(tmp_path: Path) -> None:
    path = write(tmp_path, "g.yaml", "upstreams:\n  a: {command: echo, timeout: soon}\n")
    with pytest.raises(ConfigError, match=r"upstreams\.a\.timeout: Input should be a valid number"):
        load_config(path, {})


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "upstreams:\n  notes: {command: echo, exclude: word_count}\n",
            "upstreams.notes.exclude: should be a list (of strings), not a string",
        ),
        (
            "upstreams:\n  notes: {command: echo}\nagent:\n  require_approval: memory__delete_*\n",
            "agent.require_approval: should be a list (of strings), not a string",
        ),
        (
            "upstreams:\n  notes: {command: echo, args: 5}\n",
            "upstreams.notes.args: should be a list (of strings), not a number",
        ),
        (
            "upstreams:\n  notes: {command: echo, env: A=b}\n",
            "upstreams.notes.env: should be a mapping (key: value), not a string",
        ),
        ("upstreams:\n  notes: echo\n", "upstreams.notes: should be a mapping (key: value), not a string"),
        (
            "upstreams:\n  notes: {command: echo}\nauth:\n  mode: bearer\n  tokens: secret-of-forty-characters\n",
            "auth.tokens: should be a list, not a string",
        ),
    ],
    ids=["exclude", "require_approval", "args", "env", "upstream", "tokens"],
)
def test_a_value_of_the_wrong_shape_is_said_to_be_a_list_or_a_mapping_in_yamls_words(
    tmp_path: Path, text: str, said: str
) -> None:
    # It said "Input should be a valid tuple" for a string written where a list goes; the
    # value itself is never repeated (it may be a secret).
    path = write(tmp_path, "g.yaml", text)
    with pytest.raises(ConfigError) as refused:
        load_config(path, {})
    assert str(refused.value) == f"{path}: {said}"


def test_a_bad_upstream_name_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "g.yaml", "upstreams:\n  'my server': {command: echo}\n")
    with pytest.raises(ConfigError, match=r"upstreams\.my server: upstream name 'my server' must be"):
        load_config(path, {})


def test_an_upstream_name_ending_as_the_separator_begins_is_refused() -> None:
    # A policy's "a__*" (upstream a's tools) matched "a___x", the tool x of an upstream "a_".
    data = {"upstreams": {"a": {"command": "x"}, "a_": {"command": "x"}}}
    with pytest.raises(ConfigError, match=r"upstreams\.a_: upstream name 'a_' must not end with '_'"):
        parse_config(data, {}, source="s")
    separator = {"upstreams": {"a-": {"command": "x"}}, "server": {"separator": "--"}}
    with pytest.raises(ConfigError, match=r"upstream name 'a-' must not end with '-'"):
        parse_config(separator, {}, source="s")
    assert parse_config({"upstreams": {"a-_b": {"command": "x"}}}, {}, source="s").upstreams


def test_an_upstream_needs_exactly_one_of_command_or_url() -> None:
    with pytest.raises(ConfigError, match=r"upstreams\.a: set exactly one of 'command'"):
        parse_config({"upstreams": {"a": {"command": "x", "url": "http://y"}}}, {}, source="s")


@pytest.mark.parametrize(
    ("transport", "url", "reason"),
    [
        ("websocket", "http://h/mcp", "transport 'websocket' needs a ws:// or wss:// url, not http://..."),
        ("sse", "ws://h/mcp", "transport 'sse' needs an http:// or https:// url, not ws://..."),
        ("streamable-http", "wss://h/mcp", "transport 'streamable-http' needs an http:// or https://"),
        ("stdio", "http://h/mcp", "transport 'stdio' needs a 'command', not a 'url'"),
    ],
    ids=["websocket-over-http", "sse-over-ws", "http-over-wss", "stdio-with-url"],
)
def test_a_transport_its_url_cannot_speak_is_refused(transport: str, url: str, reason: str) -> None:
    # Accepted, the upstream would only be down at start-up with the HTTP or WebSocket
    # library's own complaint about the scheme, far from the line that is wrong.
    data = {"upstreams": {"a": {"url": url, "transport": transport}}}
    with pytest.raises(ConfigError) as caught:
        parse_config(data, {}, source="s")
    assert str(caught.value).startswith(f"s: upstreams.a: {reason}")


def test_several_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError, match="2 problems") as caught:
        parse_config({"upstreams": {"a": {"command": "x", "bogus": 1, "timeout": -1}}}, {}, source="s")
    assert "upstreams.a.bogus" in str(caught.value)
    assert "upstreams.a.timeout" in str(caught.value)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"g\.yaml: line 2, column 1: not valid YAML"):
        load_config(write(tmp_path, "g.yaml", "upstreams: [unclosed\n"), {})


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "nope.yaml", {})
    assert str(refused.value) == f"{tmp_path / 'nope.yaml'}: cannot read the file: No such file or directory"


def test_a_missing_file_named_relative_is_said_with_the_whole_path_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run from another directory, "gateway.yaml: cannot read the file" did not say where.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        load_config("gateway.yaml", {})
    said = f"gateway.yaml: cannot read the file {tmp_path / 'gateway.yaml'}: No such file or directory"
    assert str(refused.value) == said


def test_the_mcp_servers_json_format_is_accepted(tmp_path: Path) -> None:
    data = {
        "mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "server-filesystem", "/tmp"], "env": {"A": "1"}},
            "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"X": "y"}},
            "old": {"type": "sse", "url": "http://127.0.0.1:9/sse", "disabled": True},
        }
    }
    config = load_config(write(tmp_path, "claude.json", json.dumps(data)), {})
    assert config.upstreams["fs"].args == ("-y", "server-filesystem", "/tmp")
    assert config.upstreams["remote"].kind == "streamable-http"
    assert config.upstreams["old"].kind == "sse"
    assert list(config.active_upstreams) == ["fs", "remote"]


def test_secrets_do_not_appear_in_the_config_repr() -> None:
    config = parse_config(
        {"upstreams": {"a": {"url": "http://x", "headers": {"Authorization": "Bearer s3cret"}}}},
        {},
        source="s",
    )
    assert "s3cret" not in repr(config)
    # The shared store's and the conversations' database URLs hold passwords too.
    shared = parse_config(
        {
            "upstreams": {},
            "store": {"url": "redis://:r3dis-s3cret@h:6379/0"},
            "agent": {"memory": {"store": "postgres", "url": "postgresql://u:pg-s3cret@h/db"}},
        },
        {},
        source="s",
    )
    assert "r3dis-s3cret" not in repr(shared)
    assert "pg-s3cret" not in repr(shared)


def test_conversations_in_postgres_need_its_url() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"upstreams": {}, "agent": {"memory": {"store": "postgres"}}}, {}, source="s")
    assert "s: agent.memory.url: store 'postgres' needs url: postgresql://user:password@host/db" in str(
        caught.value
    )


def test_a_trusted_proxy_that_is_no_address_is_refused() -> None:
    # A typo accepted would trust no proxy (every client seen as the balancer's one address)
    # or, worse, be read as some other network.
    for proxy in ("10.0.0.0/33", "loadbalancer.internal"):
        data = {"upstreams": {}, "server": {"connections": {"trusted_proxies": ["127.0.0.1", proxy]}}}
        with pytest.raises(ConfigError, match=f"trusted_proxies: '{re.escape(proxy)}' is not an IP address"):
            parse_config(data, {}, source="s")


def test_the_example_gateway_yaml_is_valid() -> None:
    config = load_config(Path(__file__).resolve().parent.parent / "gateway.yaml", {})
    assert set(config.upstreams) >= {"everything", "memory", "notes"}


def test_a_short_state_key_is_rejected_without_showing_it(tmp_path: Path) -> None:
    path = write(tmp_path, "g.yaml", "server:\n  state_keys: ['${KEY}']\n")
    with pytest.raises(
        ConfigError, match=r"server\.state_keys\.0: String should have at least 32 characters"
    ) as caught:
        load_config(path, {"KEY": "short-secret"})
    assert "short-secret" not in str(caught.value)


def test_a_model_base_url_of_another_scheme_is_rejected_without_its_credentials(tmp_path: Path) -> None:
    # The message quoted the whole URL, user and password included.
    text = "agent:\n  model: {provider: openai, model: m, api_key: k, base_url: '${BASE}'}\n"
    path = write(tmp_path, "g.yaml", text)
    with pytest.raises(
        ConfigError, match=r"agent\.model\.base_url: must start with http:// or https://, not ftp://\.\.\."
    ) as caught:
        load_config(path, {"BASE": "ftp://admin:model-password@models.internal/v1"})
    assert "model-password" not in str(caught.value)


def test_two_token_names_for_one_secret_are_refused_naming_both(tmp_path: Path) -> None:
    # Its bearer got the first name's policy, silently: "admin" was never applied.
    secret = "one-secret-pasted-twice-0123"
    digest = hashlib.sha256(secret.encode()).hexdigest().upper()
    text = (
        "auth:\n  mode: bearer\n  tokens:\n"
        "    - {name: ci, token: '${TOKEN}', policy: readonly}\n"
        f"    - {{name: admin, sha256: {digest}, policy: operators}}\n"
        "  policies: {readonly: {tools: []}, operators: {admin: true}}\n"
    )
    with pytest.raises(
        ConfigError, match=r"auth\.tokens: tokens 'ci' and 'admin' are the same secret"
    ) as caught:
        load_config(write(tmp_path, "g.yaml", text), {"TOKEN": secret})
    assert secret not in str(caught.value)


def test_relative_paths_mean_the_config_files_directory_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "conf"
    home.mkdir()
    text = (
        "upstreams:\n"
        "  a: {command: ./bin/server, cwd: work, env: {DB: ./state/db.json, UP: ../up.txt, NAME: plain}}\n"
        "  b: {command: npx}\n"
        "agent: {memory: {path: .agent-gateway/c.sqlite}}\n"
    )
    write(home, "g.yaml", text)
    monkeypatch.chdir(tmp_path)
    config = load_config(Path("conf/g.yaml"), {})
    a, b = config.upstreams["a"], config.upstreams["b"]
    assert a.command == str(home / "bin/server")
    assert a.cwd == str(home / "work")
    assert a.env == {"DB": str(home / "state/db.json"), "UP": str(tmp_path / "up.txt"), "NAME": "plain"}
    assert (home / "state").is_dir()  # servers such as server-memory do not create it
    assert (b.command, b.cwd) == ("npx", str(home))
    assert config.agent.memory.path == str(home / ".agent-gateway/c.sqlite")


def test_config_dir_names_the_config_files_directory_even_if_the_environment_sets_it(tmp_path: Path) -> None:
    text = "upstreams:\n  a: {command: node, args: ['${CONFIG_DIR}/server.js']}\n"
    config = load_config(write(tmp_path, "g.yaml", text), {"CONFIG_DIR": "/elsewhere"})
    assert config.upstreams["a"].args == (f"{tmp_path.resolve()}/server.js",)


@pytest.mark.parametrize("name", ["python", "python3"])
def test_python_as_a_command_is_the_gateways_own_interpreter(name: str) -> None:
    config = parse_config(
        {"upstreams": {"a": {"command": name}, "b": {"command": "/usr/bin/python3"}}}, {}, source="s"
    )
    assert config.upstreams["a"].command == sys.executable
    assert config.upstreams["b"].command == "/usr/bin/python3"


def test_a_repeated_yaml_key_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    text = "upstreams:\n  memory: {command: a}\n  notes: {command: b}\n  memory: {command: c}\n"
    with pytest.raises(ConfigError, match=r"^.*g\.yaml: line 4: duplicate key 'memory' \(first at line 2\)$"):
        load_config(write(tmp_path, "g.yaml", text), {})


def test_a_yaml_merge_key_may_be_overridden(tmp_path: Path) -> None:
    text = "base: &base {command: a, timeout: 5}\nupstreams:\n  x: {<<: *base, timeout: 9}\n"
    with pytest.raises(ConfigError, match="unknown key 'base'"):  # parsed; only the extra key is wrong
        load_config(write(tmp_path, "g.yaml", text), {})


def test_a_repeated_json_key_is_an_error(tmp_path: Path) -> None:
    text = '{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}'
    with pytest.raises(ConfigError, match=r"claude\.json: duplicate key 'a'"):
        load_config(write(tmp_path, "claude.json", text), {})


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n"])
def test_an_empty_file_names_the_file_and_line(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"g\.yaml: line 1: the file is empty"):
        load_config(write(tmp_path, "g.yaml", text), {})


def test_a_yaml_syntax_error_is_one_line_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, "g.yaml", "server:\n  port: 1\n upstreams: {}\n"), {})
    assert "\n" not in str(caught.value)
    assert "g.yaml: line 3, column 2: not valid YAML:" in str(caught.value)


def test_env_passthrough_takes_names_and_globs_and_the_top_level_reaches_every_upstream() -> None:
    config = parse_config(
        {
            "env_passthrough": ["AWS_*"],
            "upstreams": {"a": {"command": "x", "env_passthrough": ["KUBECONFIG"]}},
        },
        {},
        source="s",
    )
    assert config.upstreams["a"].env_passthrough == ("AWS_*", "KUBECONFIG")
    with pytest.raises(ConfigError, match=r"upstreams\.a\.env_passthrough\.0: String should match pattern"):
        parse_config({"upstreams": {"a": {"command": "x", "env_passthrough": ["A B"]}}}, {}, source="s")


@pytest.mark.parametrize("mode", ["off", "on", "auto"])
def test_the_words_on_and_off_are_read_as_written(tmp_path: Path, mode: str) -> None:
    """YAML 1.1 reads a bare ``off``/``on`` as a boolean; the README writes ``mode: off``."""
    text = f"search:\n  mode: {mode}\npinning: off\nupstreams:\n  a: {{command: echo, enabled: no, env: {{DEBUG: yes}}}}\n"
    config = load_config(write(tmp_path, "g.yaml", text), {})
    assert config.search.mode == mode
    assert config.pinning == "off"
    assert config.upstreams["a"].enabled is False  # a boolean setting still takes yes/no
    assert config.upstreams["a"].env == {"DEBUG": "yes"}  # an environment value is the word


@pytest.mark.parametrize("name", ["search_tools", "call_tool"])
def test_the_agent_cannot_take_a_search_tools_name(tmp_path: Path, name: str) -> None:
    """With search ``auto`` any client may be in search mode: the agent would be listed next to
    the search tool of its name, and never reached."""
    with pytest.raises(
        ConfigError, match=f"agent.name: '{name}' is the name of one of the gateway's search tools"
    ):
        load_config(write(tmp_path, "g.yaml", f"agent:\n  name: {name}\n"), {})


@pytest.mark.parametrize("target", ['""', "x" * 65, "'a b'"])
def test_a_rename_target_must_be_a_tool_name(tmp_path: Path, target: str) -> None:
    """An empty one published ``a__``; one of 10,000 characters, a name no client takes."""
    text = f"upstreams:\n  a: {{command: echo, rename: {{sleep: {target}}}}}\n"
    with pytest.raises(ConfigError, match=r"upstreams\.a\.rename\.sleep: .*\^\[A-Za-z0-9_-\]\{1,64\}\$"):
        load_config(write(tmp_path, "g.yaml", text), {})


@pytest.mark.parametrize("name", ["anonymous", "anonymous@10.0.0.1"])
def test_a_token_named_as_clients_without_one_are_keyed_is_refused(tmp_path: Path, name: str) -> None:
    # Its bearer shared the limits and policy of every client without a token (stdio's).
    text = f"auth:\n  mode: bearer\n  tokens:\n    - {{name: '{name}', token: '${{TOKEN}}'}}\n"
    with pytest.raises(
        ConfigError, match=rf"auth\.tokens\.0\.name: .*'{name}' names clients without a token"
    ):
        load_config(write(tmp_path, "g.yaml", text), {"TOKEN": "a-token-0123456789abcdef"})
