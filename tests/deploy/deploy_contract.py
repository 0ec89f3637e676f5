"""What the deployment files must agree on, and small readers the deploy tests share.

The runtime contract (docs/architecture.md, "Contracts", and the services' CLI): service names, ports, the
addresses in MMRL_* variables. Every check reads the files as text or renders them with the real
tools (kubectl kustomize, docker compose); nothing here runs a container or talks to a cluster
(scripts/compose-check.sh builds the images and runs the stack).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "Dockerfile"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
ENV_EXAMPLE = REPO_ROOT / ".env.example"

# Service name -> port, in docker-compose and Kubernetes alike.
CONTRACT_PORTS = {"env": 50051, "rollout": 50052, "learner": 50053, "coordinator": 8000, "redis": 6379}
RENDEZVOUS_PORT = 29400
# The variables that hold service addresses, and the service each must reach.
ADDRESS_VARIABLES = {"MMRL_ENV_ADDR": "env", "MMRL_ROLLOUT_ADDRS": "rollout", "MMRL_LEARNER_ADDRS": "learner"}
# Dockerfile target -> the service its image runs.
SERVICE_TARGETS = {
    "env": "env",
    "coordinator": "coordinator",
    "rollout-cpu": "rollout",
    "rollout-gpu": "rollout",
    "learner-cpu": "learner",
    "learner-gpu": "learner",
}
REDIS_TARGET = "redis"
GPU_RESOURCE = "nvidia.com/gpu"

# No network for the tools: a remote kustomize base or a registry lookup fails instead of passing.
OFFLINE_ENV = {
    **os.environ,
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "KUBECONFIG": os.devnull,
}


def run_tool(name: str, *args: str, cwd: Path = REPO_ROOT) -> str:
    """Runs a CLI offline and returns its stdout; skips the test when the tool is not installed."""
    binary = shutil.which(name)
    if binary is None:
        pytest.skip(f"{name} is not installed, so this static check cannot run")
    proc = subprocess.run(
        [binary, *args], cwd=cwd, env=OFFLINE_ENV, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, f"{name} {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def run_compose(*args: str, cwd: Path) -> str:
    """`docker compose ARGS` (Compose v2, the CLI plugin) offline; skips when it is not installed."""
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode:
        pytest.skip("docker compose (v2) is not installed, so this static check cannot run")
    return run_tool("docker", "compose", *args, cwd=cwd)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ---- Kubernetes objects ----


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template's spec of a workload (Deployment, StatefulSet, Job), else None."""
    template = obj.get("spec", {}).get("template")
    return template["spec"] if template else None


def workloads(objs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (obj for obj in objs if pod_spec(obj) is not None)


def containers(obj: dict[str, Any], init: bool = True) -> list[dict[str, Any]]:
    spec = pod_spec(obj) or {}
    return list(spec.get("containers", [])) + (list(spec.get("initContainers", [])) if init else [])


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in containers(obj) if c["name"] == name]
    assert len(matches) == 1, f"{obj['metadata']['name']} has no single container {name}"
    return matches[0]


def settings(objs: list[dict[str, Any]]) -> dict[str, str]:
    """The MMRL_* settings ConfigMap (its generated name carries a hash suffix)."""
    maps = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("mmrl-settings")]
    assert len(maps) == 1
    return maps[0]["data"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def template_labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["spec"]["template"]["metadata"].get("labels", {})


def pod_labels(obj: dict[str, Any]) -> list[dict[str, str]]:
    """The labels of each pod a workload runs: a StatefulSet's controller adds the pod's name."""
    labels = template_labels(obj)
    if obj["kind"] != "StatefulSet":
        return [labels]
    name = obj["metadata"]["name"]
    return [
        {**labels, "statefulset.kubernetes.io/pod-name": f"{name}-{i}"}
        for i in range(obj["spec"].get("replicas", 1))
    ]


def load_yaml_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


# ---- Dockerfile ----


@dataclass
class Stage:
    """One `FROM ... AS name` stage: its base (an image or an earlier stage) and its instructions."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]


def dockerfile_global_args(path: Path = DOCKERFILE) -> dict[str, str]:
    """The ARGs declared before the first FROM, with their default values (quotes removed)."""
    args = {}
    for instruction, value in _dockerfile_instructions(path):
        if instruction == "FROM":
            break
        if instruction == "ARG":
            key, _, default = value.partition("=")
            args[key] = default.strip('"')
    return args


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for instruction, value in _dockerfile_instructions(path):
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", value, re.IGNORECASE)
            assert match, f"every stage is named: FROM {value}"
            current = stages[match.group(2)] = Stage(match.group(2), match.group(1))
        elif current is not None:
            current.instructions.append((instruction, value))
    return stages


def stage_chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """A stage and the stages it is built FROM, the root first."""
    chain = [stages[name]]
    while chain[0].base in stages:
        chain.insert(0, stages[chain[0].base])
    return chain


def _dockerfile_instructions(path: Path) -> Iterator[tuple[str, str]]:
    logical = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        instruction, _, value = logical.partition(" ")
        yield instruction.upper(), " ".join(value.split())
        logical = ""
