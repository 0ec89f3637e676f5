"""Static checks of the observability files: promtool accepts the Prometheus config, every query of the
Grafana dashboard names a metric the services export, and the compose and Kubernetes objects point
at the ports the services serve their metrics on."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_contract import REPO_ROOT, run_tool

from tests.promql import DASHBOARD, PROMETHEUS_OWN, dashboard_queries, metric_names

PROMETHEUS_CONFIG = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def mmrl_exported_names() -> set[str]:
    """Sample names the services' metric modules register (imported here, as each service does)."""
    import services.coordinator.ops.prometheus  # noqa: F401
    import services.env.metrics  # noqa: F401
    import services.learner.metrics  # noqa: F401
    import services.rollout.metrics  # noqa: F401
    from services.common.metrics import exported_names

    # Names read from the run store at scrape time (services/coordinator/ops/prometheus.py).
    from services.coordinator.ops.prometheus import RUN_GAUGES

    return exported_names() | {"mmrl_runs", "mmrl_run_step"} | {name for name, *_ in RUN_GAUGES}


def vllm_metric_names() -> set[str]:
    """The `vllm:*` names the installed vLLM's Prometheus stat logger registers (read from its source)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vllm is not installed"
    source = (Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics" / "loggers.py").read_text()
    return set(re.findall(r'name="(vllm:[a-z_]+)"', source))


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/install-system-deps.sh installs it (Debian package prometheus)"
    result = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_query_parser_finds_the_metrics_of_a_query() -> None:
    expr = 'histogram_quantile(0.9, sum by (le, phase) (rate(mmrl_run_phase_seconds_bucket{run_id=~"$run"}[15m])))'
    assert metric_names(expr) == {"mmrl_run_phase_seconds_bucket"}
    assert metric_names("rate(vllm:prefix_cache_hits_total[5m]) / rate(vllm:prefix_cache_queries_total[5m])") == {
        "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}
    assert metric_names('sum by (code) (rate(mmrl_env_errors_total{code!="OK"}[5m])) * 60') == {"mmrl_env_errors_total"}


def test_every_dashboard_query_names_a_metric_the_services_export() -> None:
    exported = mmrl_exported_names()
    vllm = vllm_metric_names()
    used = {name for expr in dashboard_queries() for name in metric_names(expr)}
    assert used, "no query found"
    unknown = set()
    for name in used:
        if name.startswith("vllm:"):
            base = next((name[: -len(s)] for s in SAMPLE_SUFFIXES if name.endswith(s)), name)
            if base not in vllm:
                unknown.add(name)
        elif name not in exported and name not in PROMETHEUS_OWN:
            unknown.add(name)
    assert not unknown, f"dashboard queries name metrics nobody exports: {sorted(unknown)}"
    # Each concern has its row, and every service appears in some query.
    rows = [p["title"] for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] == "row"]
    assert rows == ["Learning", "Throughput", "Sync", "Services"]
    for prefix in ("mmrl_run_", "mmrl_env_", "mmrl_rollout_", "mmrl_learner_", "vllm:"):
        assert any(n.startswith(prefix) for n in used), prefix


def test_prometheus_scrapes_each_service_on_the_port_compose_gives_it() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"][0] for job in config["scrape_configs"]}
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    environment = compose["x-mmrl-environment"]
    assert targets == {
        "mmrl-coordinator": "coordinator:8000",
        "mmrl-env": f"env:{environment['MMRL_ENV_METRICS_PORT']}",
        "mmrl-rollout": f"rollout:{environment['MMRL_ROLLOUT_METRICS_PORT']}",
        "mmrl-learner": f"learner:{environment['MMRL_LEARNER_METRICS_PORT']}",
    }
    observability = {n for n, s in compose["services"].items() if "observability" in s.get("profiles", [])}
    assert observability == {"prometheus", "grafana", "jaeger"}


@pytest.fixture(scope="module")
def grafana_objects() -> list[dict]:
    return list(yaml.safe_load_all(run_tool("kubectl", "kustomize", str(REPO_ROOT / "deploy" / "grafana"))))


def test_the_kubernetes_dashboard_configmap_holds_the_dashboard(grafana_objects: list[dict]) -> None:
    (configmap,) = [o for o in grafana_objects if o["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["mmrl-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_pod_monitors_and_annotations_point_at_named_metrics_ports(
        grafana_objects: list[dict], manifests: dict) -> None:
    from deploy_contract import containers, template_labels, workloads

    ports: dict[str, dict[str, int]] = {}
    for obj in workloads(manifests["base"]):
        component = template_labels(obj)["app.kubernetes.io/component"]
        ports[component] = {p["name"]: p["containerPort"] for c in containers(obj) for p in c.get("ports", [])
                            if "name" in p}
        annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
        if component != "redis":
            assert annotations.get("prometheus.io/scrape") == "true", component
            assert int(annotations["prometheus.io/port"]) in ports[component].values(), component
    monitors = [o for o in grafana_objects if o["kind"] == "PodMonitor"]
    scraped = set()
    for monitor in monitors:
        component = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            scraped.add(ports[component][endpoint["port"]])
    assert scraped == {8000, 9101, 9102, 9103}
