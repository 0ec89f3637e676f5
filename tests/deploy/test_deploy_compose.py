"""Static checks of docker-compose.yml: it parses with the real `docker compose` for both profiles, and
agrees with the runtime contract, the Dockerfile targets and the Kubernetes manifests."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_contract import (
    ADDRESS_VARIABLES,
    COMPOSE_FILE,
    CONTRACT_PORTS,
    ENV_EXAMPLE,
    container,
    containers,
    dockerfile_stages,
    find,
    run_compose,
    settings,
    workloads,
)

Config = dict[str, Any]
PROFILES = ("cpu", "gpu")
ONE_SHOT_SERVICES = {"init-model", "fetch-model"}
OBSERVABILITY_SERVICES = {"prometheus", "grafana", "jaeger"}  # profile observability, third-party images


@pytest.fixture(scope="module")
def compose_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Config]:
    """`docker compose config` of each profile, resolved the way `up` would see it.

    Run in a copy of the project with .env made from .env.example: the real .env holds a token and
    may not exist."""
    project = tmp_path_factory.mktemp("compose")
    shutil.copy(COMPOSE_FILE, project / "docker-compose.yml")
    shutil.copy(ENV_EXAMPLE, project / ".env")
    return {
        profile: yaml.safe_load(run_compose("--profile", profile, "config", cwd=project))
        for profile in PROFILES
    }


def _active(config: Config, profile: str) -> dict[str, Config]:
    """The services `up` starts under a profile."""
    return {
        name: service
        for name, service in config["services"].items()
        if not service.get("profiles") or profile in service["profiles"]
    }


def _dns_names(name: str, service: Config) -> set[str]:
    aliases = {a for net in (service.get("networks") or {}).values() for a in (net or {}).get("aliases", [])}
    return {name} | aliases


def _port_of(service: Config) -> int:
    """The port a service's command listens on (`--port N`), or redis's default."""
    command = service.get("command") or []
    if "--port" in command:
        return int(command[command.index("--port") + 1])
    assert command[0] == "redis-server"
    return CONTRACT_PORTS["redis"]


def test_compose_file_parses_for_the_cpu_and_the_gpu_profile(compose_configs: dict[str, Config]) -> None:
    for profile in PROFILES:
        assert {"redis", "env", "rollout", "learner", "coordinator"} <= {
            dns
            for name, service in _active(compose_configs[profile], profile).items()
            for dns in _dns_names(name, service)
        }


def test_cpu_is_the_default_profile_in_the_example_env_file() -> None:
    assert re.search(r"^COMPOSE_PROFILES=cpu$", ENV_EXAMPLE.read_text(), re.MULTILINE)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_long_running_compose_service_has_a_healthcheck(
    compose_configs: dict[str, Config], profile: str
) -> None:
    for name, service in _active(compose_configs[profile], profile).items():
        healthcheck = service.get("healthcheck", {})
        if name in ONE_SHOT_SERVICES:
            assert service["restart"] == "no" and healthcheck.get("disable") is True, name
        else:
            assert healthcheck.get("test", ["NONE"]) != ["NONE"], f"{name} has no healthcheck"
            assert service["restart"] == "unless-stopped", name


@pytest.mark.parametrize("profile", PROFILES)
def test_each_contract_name_answers_on_its_contract_port_exactly_once_per_profile(
    compose_configs: dict[str, Config], profile: str
) -> None:
    active = _active(compose_configs[profile], profile)
    for dns_name, port in CONTRACT_PORTS.items():
        answering = [name for name, service in active.items() if dns_name in _dns_names(name, service)]
        assert len(answering) == 1, f"{profile}: {dns_name} answers from {answering}"
        service = active[answering[0]]
        assert _port_of(service) == port, answering[0]
        if dns_name != "redis":
            assert (
                f"localhost:{port}" in " ".join(service["healthcheck"]["test"]) or dns_name == "coordinator"
            )


@pytest.mark.parametrize("profile", PROFILES)
def test_dependents_wait_for_healthy_services_and_for_the_model_to_exist(
    compose_configs: dict[str, Config], profile: str
) -> None:
    active = _active(compose_configs[profile], profile)
    (coordinator,) = [s for n, s in active.items() if "coordinator" in _dns_names(n, s)]
    waits_for = coordinator["depends_on"]
    reached = [_dns_names(name, active[name]) & set(CONTRACT_PORTS) for name in waits_for]
    assert all(len(names) == 1 for names in reached)
    assert set.union(*reached) == set(CONTRACT_PORTS) - {"coordinator"}
    assert all(d["condition"] == "service_healthy" for d in waits_for.values())
    (one_shot,) = ONE_SHOT_SERVICES & set(active)
    for name, service in active.items():
        if _dns_names(name, service) & {"rollout", "learner"}:
            assert service["depends_on"] == {
                one_shot: {"condition": "service_completed_successfully", "required": True}
            }


def test_the_gpu_profile_colocates_rollout_and_learner_on_the_same_device(
    compose_configs: dict[str, Config],
) -> None:
    active = _active(compose_configs["gpu"], "gpu")
    devices = {}
    for name, service in active.items():
        reserved = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        if reserved:
            devices[name] = reserved
    assert set(devices) == {"rollout-gpu", "learner-gpu"}
    assert devices["rollout-gpu"] == devices["learner-gpu"]
    (device,) = devices["rollout-gpu"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["device_ids"]
    cpu_active = _active(compose_configs["cpu"], "cpu")
    assert not any("deploy" in service for service in cpu_active.values())


def test_every_mmrl_service_mounts_the_shared_volume_and_redis_has_its_own(
    compose_configs: dict[str, Config],
) -> None:
    for profile in PROFILES:
        for name, service in compose_configs[profile]["services"].items():
            if name in OBSERVABILITY_SERVICES:
                continue
            mounts = [(v["type"], v["source"], v["target"]) for v in service["volumes"]]
            if name == "redis":
                assert mounts == [("volume", "redis-data", "/data")]
                command = service["command"]
                assert command[command.index("--appendonly") + 1] == "yes"
                assert command[command.index("--dir") + 1] == "/data"
            else:
                assert ("volume", "shared", "/shared") in mounts, name


def test_only_the_coordinator_api_is_published_and_only_on_loopback(compose_configs: dict[str, Config]) -> None:
    for profile in PROFILES:
        published = {
            name: service["ports"] for name, service in compose_configs[profile]["services"].items()
            if service.get("ports")
        }
        assert set(published) == {"coordinator" if profile == "cpu" else "coordinator-gpu"}, profile
        for port in (p for ports in published.values() for p in ports):
            assert port["host_ip"] == "127.0.0.1" and port["target"] == CONTRACT_PORTS["coordinator"]


def test_every_image_build_gets_the_package_ca_only_as_a_build_secret(compose_configs: dict[str, Config]) -> None:
    """The secret is empty (/dev/null) unless .env names a bundle in MMRL_PACKAGE_CA."""
    for profile in PROFILES:
        config = compose_configs[profile]
        assert config["secrets"]["package-ca"]["file"] == "/dev/null"
        for name, service in config["services"].items():
            assert service["build"]["secrets"] == [{"source": "package-ca"}], name
            assert "package-ca" not in str(service.get("secrets", "")), name
            assert not any("CA" in key for key in service["build"].get("args", {})), name


def test_the_api_token_comes_only_from_the_env_file(compose_configs: dict[str, Config]) -> None:
    raw = COMPOSE_FILE.read_text()
    assert "MMRL_API_TOKEN" not in raw, "the token belongs in .env, not in docker-compose.yml"
    assert re.search(r"^MMRL_API_TOKEN=", ENV_EXAMPLE.read_text(), re.MULTILINE)
    coordinators = [
        service
        for profile in PROFILES
        for name, service in compose_configs[profile]["services"].items()
        if name.startswith("coordinator")
    ]
    assert len(coordinators) == 2
    for service in coordinators:
        assert "MMRL_API_TOKEN" in service["environment"]  # resolved from env_file: .env


def test_compose_addresses_match_the_kubernetes_base(
    compose_configs: dict[str, Config], manifests: dict[str, list[dict[str, Any]]]
) -> None:
    k8s = settings(manifests["base"])
    for name, service in compose_configs["cpu"]["services"].items():
        if name in ("redis", "fetch-model", *OBSERVABILITY_SERVICES):
            continue
        environment = service["environment"]
        for variable in (*ADDRESS_VARIABLES, "MMRL_REDIS_URL", "MMRL_SHARED_ROOT", "MMRL_LOG_LEVEL"):
            assert environment[variable] == k8s[variable], f"{name}: {variable}"


def test_compose_images_are_built_from_dockerfile_targets_and_match_the_kubernetes_images(
    compose_configs: dict[str, Config], manifests: dict[str, list[dict[str, Any]]]
) -> None:
    targets = set(dockerfile_stages())
    images_by_target: dict[str, set[str]] = {}
    for profile in PROFILES:
        for name, service in _active(compose_configs[profile], profile).items():
            if "build" not in service:
                continue
            assert Path(service["build"]["dockerfile"]) == Path("deploy/docker/Dockerfile"), name
            assert service["build"]["target"] in targets, name
            images_by_target.setdefault(service["build"]["target"], set()).add(service["image"])
    assert all(len(images) == 1 for images in images_by_target.values()), images_by_target
    compose_images = {image for images in images_by_target.values() for image in images}
    compose_images.add(compose_configs["cpu"]["services"]["redis"]["image"])
    k8s_images = {c["image"] for obj in workloads(manifests["local"]) for c in containers(obj)}
    assert k8s_images <= compose_images
    redis = container(find(manifests["local"], "StatefulSet", "redis"), "redis")
    assert redis["image"] == compose_configs["cpu"]["services"]["redis"]["image"]
