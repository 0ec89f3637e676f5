"""Every port docker-compose.yml publishes, in every profile (observability included) and with
make compose-check's trace sink, binds 127.0.0.1, unless the docs name it on another address
(`0.0.0.0:PORT` in deploy/README.md or docs/observability.md). Redis has no password and Grafana
lets anyone in as a viewer: nothing is reachable from other machines by accident."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_contract import COMPOSE_FILE, ENV_EXAMPLE, REPO_ROOT, run_compose

PROFILES = ("cpu", "gpu", "observability")
TRACE_SINK = REPO_ROOT / "deploy" / "docker" / "compose-trace-sink.yml"
DOCS = (REPO_ROOT / "deploy" / "README.md", REPO_ROOT / "docs" / "observability.md")


def rendered(compose_text: str, project: Path, *extra: Path) -> dict[str, Any]:
    """`docker compose config` of every profile at once, in a copy of the project."""
    project.mkdir(parents=True, exist_ok=True)
    (project / "docker-compose.yml").write_text(compose_text)
    shutil.copy(ENV_EXAMPLE, project / ".env")
    files = ["-f", "docker-compose.yml"]
    for path in extra:
        shutil.copy(path, project / path.name)
        files += ["-f", path.name]
    profiles = [word for profile in PROFILES for word in ("--profile", profile)]
    return yaml.safe_load(run_compose(*files, *profiles, "config", cwd=project))


def exposed_beyond_loopback(config: dict[str, Any], docs: str) -> list[str]:
    """Published ports bound to anything but 127.0.0.1 that the docs do not name as such."""
    wrong = []
    for name, service in config["services"].items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") or "0.0.0.0"
            if host_ip != "127.0.0.1" and f"{host_ip}:{port['published']}" not in docs:
                wrong.append(f"{name}: {host_ip}:{port['published']} -> {port['target']}")
    return wrong


def _docs() -> str:
    return "\n".join(path.read_text() for path in DOCS)


def test_every_published_port_binds_loopback_unless_the_docs_say_otherwise(tmp_path: Path) -> None:
    config = rendered(COMPOSE_FILE.read_text(), tmp_path / "all", TRACE_SINK)
    published = {name for name, service in config["services"].items() if service.get("ports")}
    assert published >= {"coordinator", "coordinator-gpu", "prometheus", "grafana", "jaeger"}
    assert exposed_beyond_loopback(config, _docs()) == []


@pytest.mark.parametrize("original", ['"127.0.0.1:9090:9090"', '"127.0.0.1:8000:8000"'])
def test_a_port_published_on_every_interface_fails_the_check(tmp_path: Path, original: str) -> None:
    text = COMPOSE_FILE.read_text()
    assert original in text
    broken = text.replace(original, '"0.0.0.0:' + original.split(":", 1)[1], 1)
    wrong = exposed_beyond_loopback(rendered(broken, tmp_path / "broken"), _docs())
    assert wrong and all("0.0.0.0:" in w for w in wrong), wrong
