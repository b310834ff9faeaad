"""The observability/ stack: configs parse, refer to each other consistently, and the dashboard uses real metrics."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import yaml

from agent_gateway.cli import parse_arguments, serve_config
from agent_gateway.config import GatewayConfig
from agent_gateway.config_files import load_config, parse_config
from agent_gateway.telemetry import PROMETHEUS_METRICS
from tests.support import ROOT

OBSERVABILITY = Path(__file__).resolve().parents[1] / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "agent-gateway.json"

# PromQL words that are never metric names (functions are also recognised by a following "(").
PROMQL_WORDS = frozenset(
    {
        "abs",
        "and",
        "avg",
        "bool",
        "by",
        "count",
        "group_left",
        "group_right",
        "histogram_quantile",
        "ignoring",
        "increase",
        "inf",
        "irate",
        "max",
        "min",
        "nan",
        "offset",
        "on",
        "or",
        "rate",
        "sum",
        "topk",
        "unless",
        "vector",
        "without",
    }
)
HISTOGRAM_SUFFIX = re.compile(r"_(?:bucket|count|sum)$")
IDENTIFIER = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*+(?!\s*\()")


def _mapping(value: object) -> dict[str, object]:
    assert isinstance(value, dict), f"expected a mapping, got {type(value).__name__}"
    return cast("dict[str, object]", value)


def _sequence(value: object) -> list[object]:
    assert isinstance(value, list), f"expected a list, got {type(value).__name__}"
    return cast("list[object]", value)


def _load_yaml(name: str) -> dict[str, object]:
    return _mapping(yaml.safe_load((OBSERVABILITY / name).read_text(encoding="utf-8")))


def _dashboard() -> dict[str, object]:
    return _mapping(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def _panels(container: dict[str, object]) -> Iterator[dict[str, object]]:
    for raw in _sequence(container.get("panels", [])):
        panel = _mapping(raw)
        yield panel
        yield from _panels(panel)


def _expressions(dashboard: dict[str, object]) -> list[str]:
    exprs: list[str] = []
    for panel in _panels(dashboard):
        for raw in _sequence(panel.get("targets", [])):
            expr = _mapping(raw).get("expr")
            if isinstance(expr, str):
                exprs.append(expr)
    return exprs


def _variable_metrics(dashboard: dict[str, object]) -> list[str]:
    """Metrics named by ``label_values(metric, label)`` template variable queries."""
    names: list[str] = []
    for raw in _sequence(_mapping(dashboard["templating"])["list"]):
        definition = _mapping(raw).get("definition")
        if isinstance(definition, str) and (found := re.match(r"label_values\(\s*([\w:]+)\s*,", definition)):
            names.append(found.group(1))
    return names


def _family(name: str) -> str:
    return HISTOGRAM_SUFFIX.sub("", name)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (without label names, functions or ranges)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    return {name for name in IDENTIFIER.findall(text) if name.lower() not in PROMQL_WORDS}


def _compose_services() -> dict[str, dict[str, object]]:
    services = _mapping(_load_yaml("compose.yaml")["services"])
    return {name: _mapping(service) for name, service in services.items()}


def _mounts(service: dict[str, object]) -> list[tuple[Path, str]]:
    mounts: list[tuple[Path, str]] = []
    for raw in _sequence(service.get("volumes", [])):
        assert isinstance(raw, str)
        source, target = raw.split(":")[:2]
        if source.startswith("."):
            mounts.append(((OBSERVABILITY / source).resolve(), target))
    return mounts


def test_every_observability_yaml_file_parses() -> None:
    files = sorted([*OBSERVABILITY.rglob("*.yaml"), *OBSERVABILITY.rglob("*.yml")])
    assert len(files) >= 5
    for path in files:
        _mapping(yaml.safe_load(path.read_text(encoding="utf-8")))


def test_the_dashboard_json_parses_with_its_fixed_uid() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "agent-gateway"
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in _panels(dashboard)]
    assert len(ids) == len(set(ids))


def test_compose_starts_the_four_services() -> None:
    assert {"otel-collector", "jaeger", "prometheus", "grafana"} <= set(_compose_services())


def test_compose_mounts_only_files_that_exist() -> None:
    mounts = [mount for service in _compose_services().values() for mount in _mounts(service)]
    assert mounts
    for source, _target in mounts:
        assert source.exists(), f"{source} is mounted but missing"
        assert source.is_relative_to(OBSERVABILITY)


def test_compose_publishes_the_collectors_otlp_port_on_the_hosts_loopback() -> None:
    ports = _sequence(_compose_services()["otel-collector"]["ports"])
    assert "127.0.0.1:4318:4318" in ports


def test_collector_pipelines_only_reference_components_it_defines() -> None:
    config = _load_yaml("otel-collector.yaml")
    pipelines = _mapping(_mapping(config["service"])["pipelines"])
    assert {"traces", "metrics"} <= set(pipelines)
    for name, raw in pipelines.items():
        pipeline = _mapping(raw)
        for kind in ("receivers", "processors", "exporters"):
            defined = set(_mapping(config[kind]))
            used = set(_sequence(pipeline.get(kind, [])))
            assert used <= defined, f"pipeline {name} uses undefined {kind}: {used - defined}"
        assert _sequence(pipeline["receivers"])
        assert _sequence(pipeline["exporters"])


def test_collector_receives_otlp_on_both_ports_and_sends_traces_to_jaeger() -> None:
    config = _load_yaml("otel-collector.yaml")
    protocols = _mapping(_mapping(_mapping(config["receivers"])["otlp"])["protocols"])
    assert _mapping(protocols["grpc"])["endpoint"] == "0.0.0.0:4317"
    assert _mapping(protocols["http"])["endpoint"] == "0.0.0.0:4318"
    exporters = _mapping(config["exporters"])
    assert _mapping(exporters["otlp/jaeger"])["endpoint"] == "jaeger:4317"
    traces = _mapping(_mapping(_mapping(config["service"])["pipelines"])["traces"])
    assert "otlp/jaeger" in _sequence(traces["exporters"])


def test_prometheus_reads_the_gateways_metrics_from_the_collector_not_from_the_gateway() -> None:
    config = _load_yaml("prometheus.yml")
    assert _mapping(config["global"])["scrape_interval"] == "15s"
    targets: dict[str, str] = {}
    for raw in _sequence(config["scrape_configs"]):
        job = _mapping(raw)
        path = job.get("metrics_path", "/metrics")
        assert isinstance(path, str)
        for static in _sequence(job["static_configs"]):
            for target in _sequence(_mapping(static)["targets"]):
                assert isinstance(target, str)
                targets[target] = path
    assert not any(target.startswith("host.docker.internal") for target in targets)
    collector_exporter = _mapping(_mapping(_load_yaml("otel-collector.yaml")["exporters"])["prometheus"])
    port = str(collector_exporter["endpoint"]).rpartition(":")[2]
    assert targets[f"otel-collector:{port}"] == "/metrics"


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard_folder() -> None:
    datasources = _sequence(_load_yaml("grafana/provisioning/datasources/prometheus.yml")["datasources"])
    prometheus = _mapping(datasources[0])
    assert prometheus["uid"] == "prometheus"
    assert prometheus["url"] == "http://prometheus:9090"

    providers = _sequence(_load_yaml("grafana/provisioning/dashboards/dashboards.yml")["providers"])
    dashboards_path = _mapping(_mapping(providers[0])["options"])["path"]
    grafana_mounts = {target: source for source, target in _mounts(_compose_services()["grafana"])}
    assert grafana_mounts[str(dashboards_path)] == DASHBOARD.parent
    assert "/etc/grafana/provisioning" in grafana_mounts


def test_dashboard_panels_query_the_provisioned_prometheus_datasource() -> None:
    dashboard = _dashboard()
    variables = {
        _mapping(raw)["name"]: _mapping(raw) for raw in _sequence(_mapping(dashboard["templating"])["list"])
    }
    ds_variable = variables["DS_PROMETHEUS"]
    assert ds_variable["type"] == "datasource"
    assert _mapping(ds_variable["current"])["value"] == "prometheus"
    for panel in _panels(dashboard):
        if panel["type"] != "row":
            assert _mapping(panel["datasource"])["uid"] in {"${DS_PROMETHEUS}", "prometheus"}
    assert {"upstream", "tool"} <= set(variables)


def test_metric_extraction_skips_functions_labels_and_ranges() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, agent_gateway_upstream) "
        '(rate(mcp_client_operation_duration_seconds_bucket{error_type!="x"}[5m]))) '
        "/ on (agent_gateway_upstream) agent_gateway_upstream_up or vector(0)"
    )
    assert metric_names(expr) == {"mcp_client_operation_duration_seconds_bucket", "agent_gateway_upstream_up"}


def test_every_dashboard_metric_is_one_the_gateway_exports() -> None:
    dashboard = _dashboard()
    exprs = _expressions(dashboard)
    assert exprs
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        unknown = {name for name in names if _family(name) not in PROMETHEUS_METRICS}
        assert not unknown, f"{expr!r} uses metrics /metrics does not export: {unknown}"
    for name in _variable_metrics(dashboard):
        assert _family(name) in PROMETHEUS_METRICS


def test_the_dashboard_shows_every_metric_family_the_gateway_exports() -> None:
    used = {_family(name) for expr in _expressions(_dashboard()) for name in metric_names(expr)}
    assert set(PROMETHEUS_METRICS) - used == set()


# -- the guide's commands and settings --------------------------------------------------------

GUIDE = [
    OBSERVABILITY / name for name in ("README.md", "compose.yaml", "prometheus.yml", "otel-collector.yaml")
]
SETTING = re.compile(r"^([a-z_]+(?:\.[a-z_]+)+):\s+(\S.*)$")


def _snippets(text: str) -> list[str]:
    """Shell lines, inline code and comment lines that may hold a gateway command or setting."""
    blocks = re.findall(r"```(?:sh|bash)\n(.*?)```", text, re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    lines += re.findall(r"`([^`\n]+)`", text)
    lines += [line.lstrip("# ") for line in text.splitlines() if line.lstrip().startswith("#")]
    return [re.sub(r"^[#\s]*\(?or:", "", line.strip()).removesuffix(")").strip() for line in lines]


def _command_line(snippet: str) -> list[str] | None:
    """The ``agent-gateway`` arguments a snippet stands for, or None if it is not one."""
    try:
        words = shlex.split(snippet, comments=True)
    except ValueError:
        return None
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)  # environment assignments
    if not words:
        return None
    if words[0].endswith("scripts/serve"):
        return ["serve", "-c", "gateway.yaml", *words[1:]]
    if words[0] == "agent-gateway":
        return words[1:] or None  # the name alone, in prose
    if words[0].startswith("--"):  # a flag the guide tells you to add to serve
        return ["serve", "-c", "gateway.yaml", *words]
    return None


def _guide_texts() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in GUIDE]


def test_every_gateway_command_in_the_observability_guide_is_accepted() -> None:
    commands = [c for text in _guide_texts() for s in _snippets(text) if (c := _command_line(s)) is not None]
    assert len(commands) >= 4
    for argv in commands:
        args = parse_arguments(argv)
        config = load_config(ROOT / args.config, {})
        if args.run.__name__ == "_serve":
            serve_config(args, config)  # raises ConfigError when serve would refuse it


def test_every_gateway_setting_in_the_observability_guide_is_accepted() -> None:
    shipped = yaml.safe_load((ROOT / "gateway.yaml").read_text(encoding="utf-8"))
    settings: list[dict[str, Any]] = []
    for text in _guide_texts():
        settings += [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]
        for found in (SETTING.match(s) for s in _snippets(text)):
            if found is not None and found.group(1).split(".")[0] in GatewayConfig.model_fields:
                *parents, leaf = found.group(1).split(".")
                setting: dict[str, Any] = {leaf: yaml.safe_load(found.group(2))}
                for parent in reversed(parents):
                    setting = {parent: setting}
                settings.append(setting)
    assert settings
    for setting in settings:
        merged = {**shipped, **{k: {**shipped.get(k, {}), **v} for k, v in setting.items()}}
        parse_config(merged, {}, source=f"gateway.yaml with {setting}")
