"""Static checks of deploy/k8s: the rendered base and overlays against the Kubernetes schemas and the
runtime contract. No cluster: `kubectl kustomize` renders, `kubernetes_validate` validates."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_contract import (
    ADDRESS_VARIABLES,
    CONTRACT_PORTS,
    GPU_RESOURCE,
    RENDEZVOUS_PORT,
    REPO_ROOT,
    container,
    containers,
    find,
    pod_labels,
    pod_spec,
    selects,
    settings,
    split_address,
    template_labels,
    workloads,
)

Manifests = dict[str, list[dict[str, Any]]]
OVERLAYS = ("local", "hyperpod", "local-pools")
POOL_STATEFULSETS = {"local-pools": ["learner", "learner-b"]}  # one StatefulSet per learner pool
# The oldest release the manifests claim (HyperPod EKS supports 1.30 on) and the newest bundled.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
GPU_NODE_TYPE = "ml.g7e.12xlarge"
GPUS_PER_NODE = 2
HEALTHY_NODE = ("sagemaker.amazonaws.com/node-health-status", "Schedulable")


def _arg(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def test_every_kustomization_renders_offline_into_the_expected_workloads(manifests: Manifests) -> None:
    for name, objs in manifests.items():
        kinds = {(o["kind"], o["metadata"]["name"]) for o in workloads(objs)}
        assert kinds == {
            ("Deployment", "env"),
            ("Deployment", "coordinator"),
            ("StatefulSet", "redis"),
            *(("StatefulSet", pool) for pool in POOL_STATEFULSETS.get(name, ["learner"])),
        }, name


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("kustomization", ("base", *OVERLAYS))
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(
    manifests: Manifests, kustomization: str, version: str
) -> None:
    for obj in manifests[kustomization]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} (k8s {version}): {error.message}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_long_running_container_has_readiness_and_liveness_probes(
    manifests: Manifests, overlay: str
) -> None:
    for obj in workloads(manifests[overlay]):  # all long-running: no Jobs (see the first test)
        for c in containers(obj, init=False):
            assert "readinessProbe" in c and "livenessProbe" in c, f"{obj['metadata']['name']}/{c['name']}"
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for kind in ("readinessProbe", "livenessProbe"):
                assert _probe_target(c[kind], ports) in PROBE_TARGETS[c["name"]][kind], (c["name"], kind)


# What each container's probes must reach: the service's own health endpoint on its own port.
PROBE_TARGETS = {
    "env": {"readinessProbe": {"grpc:50051"}, "livenessProbe": {"grpc:50051"}},
    "rollout": {"readinessProbe": {"grpc:50052"}, "livenessProbe": {"grpc:50052"}},
    "coordinator": {"readinessProbe": {"http:8000/readyz"}, "livenessProbe": {"http:8000/healthz"}},
    "learner": {  # rank 0 serves gRPC health; the other ranks' pods report on rank 0
        "readinessProbe": {"exec:healthcheck localhost:50053"}, "livenessProbe": {"exec:healthcheck localhost:50053"},
    },
    "redis": {"readinessProbe": {"exec:redis-cli ping"}, "livenessProbe": {"exec:redis-cli ping"}},
}


def _probe_target(probe: dict[str, Any], ports: dict[str | None, int]) -> str:
    if "grpc" in probe:
        return f"grpc:{probe['grpc']['port']}"
    if "httpGet" in probe:
        port = probe["httpGet"]["port"]
        return f"http:{ports.get(port, port)}{probe['httpGet']['path']}"
    command = " ".join(probe["exec"]["command"])
    for target in ("healthcheck localhost:50053", "redis-cli ping"):
        if target in command:
            return f"exec:{target}"
    return f"exec:{command}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_including_init_containers_has_cpu_and_memory_requests_and_limits(
    manifests: Manifests, overlay: str
) -> None:
    for obj in workloads(manifests[overlay]):
        for c in containers(obj):
            resources = c.get("resources", {})
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(part, {})), (
                    f"{obj['metadata']['name']}/{c['name']} lacks {part}"
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_pinned_to_a_tag_and_never_latest(manifests: Manifests, overlay: str) -> None:
    for obj in workloads(manifests[overlay]):
        for c in containers(obj):
            image = c["image"]
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag, f"{c['name']}: {image} has no tag"
            assert tag != "latest" and "@" not in image, f"{c['name']}: {image}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_mmrl_pod_runs_as_a_non_root_user(manifests: Manifests, overlay: str) -> None:
    for obj in workloads(manifests[overlay]):
        security = (pod_spec(obj) or {}).get("securityContext", {})
        assert security.get("runAsNonRoot") is True, obj["metadata"]["name"]
        assert security.get("runAsUser", 0) > 0, obj["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_mmrl_pod_mounts_the_shared_claim_at_shared(manifests: Manifests, overlay: str) -> None:
    objs = manifests[overlay]
    claims = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert [c["metadata"]["name"] for c in claims] == ["mmrl-shared"]
    for obj in workloads(objs):
        if obj["metadata"]["name"] == "redis":
            continue
        volumes = {v["name"]: v for v in pod_spec(obj)["volumes"]}  # type: ignore[index]
        for c in containers(obj):
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert "/shared" in mounts, f"{obj['metadata']['name']}/{c['name']}"
            claim = volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"]
            assert claim == "mmrl-shared"


def test_the_hyperpod_shared_volume_is_a_read_write_many_fsx_for_lustre_volume(manifests: Manifests) -> None:
    objs = manifests["hyperpod"]
    claim = find(objs, "PersistentVolumeClaim", "mmrl-shared")
    volume = find(objs, "PersistentVolume", claim["spec"]["volumeName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"]
    csi = volume["spec"]["csi"]
    assert csi["driver"] == "fsx.csi.aws.com"
    assert csi["volumeHandle"].startswith("fs-")
    assert {"dnsname", "mountname"} <= set(csi["volumeAttributes"])


def test_the_local_overlay_builds_the_tiny_model_before_rollout_and_learner_start(
    manifests: Manifests,
) -> None:
    learner = find(manifests["local"], "StatefulSet", "learner")
    (init,) = pod_spec(learner)["initContainers"]  # type: ignore[index]
    assert init["args"][:4] == ["init-model", "tiny", "--out", "/shared/models/tiny"]
    for name in ("learner", "rollout"):
        assert _arg(container(learner, name)["args"], "--model") == "/shared/models/tiny"


def test_gpu_requests_appear_only_in_the_hyperpod_learner_pod(manifests: Manifests) -> None:
    for overlay, objs in manifests.items():
        for obj in workloads(objs):
            for c in containers(obj):
                resources = c.get("resources", {})
                gpus = {part: resources.get(part, {}).get(GPU_RESOURCE) for part in ("requests", "limits")}
                where = (overlay, obj["metadata"]["name"], c["name"])
                if where == ("hyperpod", "learner", "learner"):
                    assert gpus == {"requests": GPUS_PER_NODE, "limits": GPUS_PER_NODE}, where
                else:
                    assert gpus == {"requests": None, "limits": None}, where


def test_hyperpod_rollout_shares_its_nodes_gpus_with_the_learner_rank(manifests: Manifests) -> None:
    learner = find(manifests["hyperpod"], "StatefulSet", "learner")
    spec = pod_spec(learner)
    assert spec is not None
    assert spec["nodeSelector"]["node.kubernetes.io/instance-type"] == GPU_NODE_TYPE
    assert spec["nodeSelector"][HEALTHY_NODE[0]] == HEALTHY_NODE[1]
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["labelSelector"]["matchLabels"], template_labels(learner))
    rollout_env = {e["name"]: e.get("value") for e in container(learner, "rollout").get("env", [])}
    assert rollout_env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    learner_args = container(learner, "learner")["args"]
    assert int(_arg(learner_args, "--nproc")) == GPUS_PER_NODE
    for name in ("learner", "rollout"):
        assert _arg(container(learner, name)["args"], "--model") == "/shared/models/Qwen3-VL-8B-Instruct"
        assert container(learner, name)["image"].endswith("-gpu")


def test_hyperpod_learner_is_a_multi_node_torchrun_job_with_its_rendezvous_on_the_first_pod(
    manifests: Manifests,
) -> None:
    objs = manifests["hyperpod"]
    learner = find(objs, "StatefulSet", "learner")
    replicas = learner["spec"]["replicas"]
    assert replicas >= 2
    assert learner["spec"]["podManagementPolicy"] == "Parallel"
    args = container(learner, "learner")["args"]
    assert int(_arg(args, "--nnodes")) == replicas
    assert _arg(args, "--rdzv-id")
    ranks_service = learner["spec"]["serviceName"]
    assert _arg(args, "--rdzv-endpoint") == f"learner-0.{ranks_service}:{RENDEZVOUS_PORT}"
    headless = find(objs, "Service", ranks_service)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert RENDEZVOUS_PORT in {p["port"] for p in headless["spec"]["ports"]}
    rollout_addresses = settings(objs)["MMRL_ROLLOUT_ADDRS"].split(",")
    assert rollout_addresses == [f"learner-{i}.{ranks_service}:50052" for i in range(replicas)]


def test_coordinator_env_and_redis_run_on_the_hyperpod_head_node(manifests: Manifests) -> None:
    for obj in workloads(manifests["hyperpod"]):
        selector = pod_spec(obj).get("nodeSelector", {})  # type: ignore[union-attr]
        assert selector.get(HEALTHY_NODE[0]) == HEALTHY_NODE[1], obj["metadata"]["name"]
        if obj["metadata"]["name"] != "learner":
            assert "sagemaker.amazonaws.com/instance-group-name" in selector, obj["metadata"]["name"]
            assert "node.kubernetes.io/instance-type" not in selector


def _container_ports(obj: dict[str, Any]) -> dict[str | int, int]:
    ports: dict[str | int, int] = {}
    for c in containers(obj, init=False):
        for p in c.get("ports", []):
            ports[p["containerPort"]] = p["containerPort"]
            if "name" in p:
                ports[p["name"]] = p["containerPort"]
    return ports


@pytest.mark.parametrize("kustomization", ("base", *OVERLAYS))
def test_services_listen_on_the_contract_ports_and_reach_a_pod_listening_there(
    manifests: Manifests, kustomization: str
) -> None:
    objs = manifests[kustomization]
    for name, port in CONTRACT_PORTS.items():
        service = find(objs, "Service", name)
        (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == port]
        backends = [
            w
            for w in workloads(objs)
            if any(selects(service["spec"]["selector"], pod) for pod in pod_labels(w))
        ]
        assert backends, f"Service {name} selects no workload"
        for workload in backends:
            target = service_port.get("targetPort", port)
            assert _container_ports(workload).get(target) == port, f"{name} -> {workload['metadata']['name']}"


def _resolve(objs: list[dict[str, Any]], address: str) -> tuple[dict[str, Any], int]:
    """The Service an in-namespace address names (`svc:port` or `pod.headless-svc:port`), and the port."""
    host, port = split_address(address)
    pod, _, service_name = host.rpartition(".")
    service = find(objs, "Service", service_name)
    if pod:
        assert service["spec"]["clusterIP"] == "None", f"{address}: pod DNS needs a headless Service"
        owners = [w for w in workloads(objs) if w["spec"].get("serviceName") == service_name]
        assert any(
            re.fullmatch(rf"{w['metadata']['name']}-(\d+)", pod)
            and int(pod.rsplit("-", 1)[1]) < w["spec"]["replicas"]
            for w in owners
        ), f"{address}: no StatefulSet pod {pod} under {service_name}"
    assert port in {p["port"] for p in service["spec"]["ports"]}, address
    return service, port


@pytest.mark.parametrize("kustomization", ("base", *OVERLAYS))
def test_every_mmrl_address_names_an_existing_service_and_port(
    manifests: Manifests, kustomization: str
) -> None:
    objs = manifests[kustomization]
    values = settings(objs)
    for variable, service_name in ADDRESS_VARIABLES.items():
        for address in values[variable].split(","):
            _, port = _resolve(objs, address)
            assert port == CONTRACT_PORTS[service_name], f"{variable}={address}"
    redis_host_port = re.fullmatch(r"redis://([^/]+)/\d+", values["MMRL_REDIS_URL"])
    assert redis_host_port, values["MMRL_REDIS_URL"]
    assert _resolve(objs, redis_host_port.group(1))[1] == CONTRACT_PORTS["redis"]
    assert values["MMRL_SHARED_ROOT"] == "/shared"


@pytest.mark.parametrize("kustomization", ("base", *OVERLAYS))
def test_every_mmrl_container_reads_the_settings_config_map(manifests: Manifests, kustomization: str) -> None:
    objs = manifests[kustomization]
    settings_name = next(
        o["metadata"]["name"]
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("mmrl-settings")
    )
    for obj in workloads(objs):
        if obj["metadata"]["name"] == "redis":
            continue
        for c in containers(obj):
            refs = [e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e]
            assert refs == [settings_name], f"{obj['metadata']['name']}/{c['name']}"


METRICS_PORTS = {9101, 9102, 9103}  # Prometheus /metrics of env, rollout, learner (open to the cluster's scraper)


def _allowed_sources(objs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """For each pod (by component label): 'outside' or the components a NetworkPolicy lets in on a
    port other than a metrics port."""
    components = {
        template_labels(w)["app.kubernetes.io/component"]: template_labels(w) for w in workloads(objs)
    }
    allowed: dict[str, set[str]] = {name: set() for name in components}
    for policy in (o for o in objs if o["kind"] == "NetworkPolicy"):
        targets = [
            n
            for n, labels in components.items()
            if selects(policy["spec"]["podSelector"].get("matchLabels", {}), labels)
        ]
        for rule in policy["spec"].get("ingress", []):
            if rule.get("ports") and {p["port"] for p in rule["ports"]} <= METRICS_PORTS:
                continue
            if "from" not in rule:
                sources = {"outside"}
            else:
                sources = set()
                for peer in rule["from"]:
                    assert set(peer) == {"podSelector"}, (
                        f"{policy['metadata']['name']}: unexpected peer {peer}"
                    )
                    sources |= {
                        n
                        for n, labels in components.items()
                        if selects(peer["podSelector"]["matchLabels"], labels)
                    }
            for target in targets:
                allowed[target] |= sources
    return allowed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_only_the_coordinator_in_from_outside_and_only_it_reach_the_services(
    manifests: Manifests, overlay: str
) -> None:
    objs = manifests[overlay]
    deny_all = [
        o
        for o in objs
        if o["kind"] == "NetworkPolicy" and o["spec"]["podSelector"] == {} and "ingress" not in o["spec"]
    ]
    assert deny_all and deny_all[0]["spec"]["policyTypes"] == ["Ingress"]
    assert _allowed_sources(objs) == {
        "coordinator": {"outside"},
        "env": {"coordinator"},
        "learner": {"coordinator", "learner"},  # the learner pods run the rollout replicas too
        "redis": {"coordinator"},
    }


def test_the_api_token_comes_from_a_secret_generated_only_by_the_local_overlay(manifests: Manifests) -> None:
    for overlay, objs in manifests.items():
        coordinator = container(find(objs, "Deployment", "coordinator"), "coordinator")
        (token,) = [e for e in coordinator["env"] if e["name"] == "MMRL_API_TOKEN"]
        secret_name = token["valueFrom"]["secretKeyRef"]["name"]
        secrets = [o for o in objs if o["kind"] == "Secret"]
        grpc_refs = {ref["secretRef"]["name"] for ref in coordinator["envFrom"] if "secretRef" in ref}
        assert len(grpc_refs) == 1, "the gRPC token Secret"
        if overlay.startswith("local"):
            assert sorted(s["metadata"]["name"] for s in secrets) == sorted([secret_name, *grpc_refs])
        else:
            assert secrets == [], f"{overlay} must not carry a Secret: it is created on the cluster"
            assert secret_name == "mmrl-api-token" and grpc_refs == {"mmrl-grpc-token"}


def test_every_grpc_party_reads_the_grpc_token(manifests: Manifests) -> None:
    for overlay, objs in manifests.items():
        pools = (("StatefulSet", pool) for pool in POOL_STATEFULSETS.get(overlay, ["learner"]))
        for kind, name in (("Deployment", "coordinator"), ("Deployment", "env"), *pools):
            for spec in find(objs, kind, name)["spec"]["template"]["spec"]["containers"]:
                refs = [r["secretRef"]["name"] for r in spec.get("envFrom", []) if "secretRef" in r]
                assert any(r.startswith("mmrl-grpc-token") for r in refs), (overlay, name, spec["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_keeps_an_append_only_file_on_its_volume_claim_template(
    manifests: Manifests, overlay: str
) -> None:
    redis = find(manifests[overlay], "StatefulSet", "redis")
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    args = container(redis, "redis")["args"]
    assert _arg(args, "--appendonly") == "yes"
    data_dir = _arg(args, "--dir")
    assert {"name": claim["metadata"]["name"], "mountPath": data_dir} in container(redis, "redis")[
        "volumeMounts"
    ]


# The run config each kustomization ships, and the overrides it applies to it (paths under /shared).
RUN_CONFIGS = {
    "base": ("maze-tiny-cpu.yaml", {"model": "/shared/models/tiny"}),
    "local": ("maze-tiny-cpu.yaml", {"model": "/shared/models/tiny"}),
    "hyperpod": ("qwen3-vl-8b-hyperpod.yaml", {}),
    "local-pools": ("maze-tiny-cpu.yaml", {"model": "/shared/models/tiny"}),
}


def test_the_coordinator_mounts_run_defaults_equal_to_the_projects_run_config(manifests: Manifests) -> None:
    for kustomization, objs in manifests.items():
        coordinator = find(objs, "Deployment", "coordinator")
        volumes = {v["name"]: v for v in pod_spec(coordinator)["volumes"]}  # type: ignore[index]
        mount = [
            m for m in container(coordinator, "coordinator")["volumeMounts"] if m["name"] == "run-defaults"
        ]
        assert mount == [{"name": "run-defaults", "mountPath": "/etc/mmrl", "readOnly": True}]
        config_map = find(objs, "ConfigMap", volumes["run-defaults"]["configMap"]["name"])
        run_defaults = yaml.safe_load(config_map["data"]["run-defaults.yaml"])
        config_file, overrides = RUN_CONFIGS[kustomization]
        expected = {**yaml.safe_load((REPO_ROOT / "configs" / config_file).read_text()), **overrides}
        assert run_defaults == expected, kustomization
        assert run_defaults["model"].startswith("/shared/models/")


@pytest.mark.parametrize(("overlay", "gpus"), [("local", 0), ("hyperpod", GPUS_PER_NODE)])
def test_each_overlay_gives_the_rollout_engine_a_parallel_layout_that_fits_its_nodes(
    manifests: Manifests, overlay: str, gpus: int
) -> None:
    from services.rollout.config import RolloutConfig

    objs = manifests[overlay]
    learner = find(objs, "StatefulSet", "learner")
    rollout = container(learner, "rollout")
    env = {e["name"]: e.get("value") for e in rollout.get("env", [])}
    mount = next(m for m in rollout["volumeMounts"] if m["name"] == "rollout-config")
    assert env["MMRL_ROLLOUT_CONFIG_FILE"] == f"{mount['mountPath']}/rollout.yaml"
    volume = next(v for v in pod_spec(learner)["volumes"] if v["name"] == "rollout-config")  # type: ignore[index]
    (config_map,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]]
    config = RolloutConfig.model_validate({"model": "m", **yaml.safe_load(config_map["data"]["rollout.yaml"])})
    config.check_backend(on_cpu=gpus == 0)
    assert config.gpus_per_service == max(gpus, 1)  # every GPU of the node serves rollouts


def test_the_pools_overlay_lists_every_pool_and_its_rollout_keeps_every_pools_run(manifests: Manifests) -> None:
    from services.rollout.config import RolloutConfig

    objs = manifests["local-pools"]
    pools = settings(objs)["MMRL_LEARNER_ADDRS"].split(",")
    assert len(pools) == len(POOL_STATEFULSETS["local-pools"]) == 2
    rank0s = set()
    for address in pools:  # each pool's address reaches rank 0 of a StatefulSet of its own
        host, _ = split_address(address)
        service = find(objs, "Service", host)
        [owner] = [w for w in workloads(objs) if any(selects(service["spec"]["selector"], p) for p in pod_labels(w))]
        rank0s.add(owner["metadata"]["name"])
        probe = " ".join(container(owner, "learner")["readinessProbe"]["exec"]["command"])
        env = {e["name"]: e.get("value") for e in container(owner, "learner").get("env", [])}
        assert '"$POOL_RANK0"' in probe and env["POOL_RANK0"] == address  # other ranks report on their own pool
    assert rank0s == set(POOL_STATEFULSETS["local-pools"])
    learner = find(objs, "StatefulSet", "learner")
    volume = next(v for v in pod_spec(learner)["volumes"] if v["name"] == "rollout-config")  # type: ignore[index]
    config_map = find(objs, "ConfigMap", volume["configMap"]["name"])
    config = RolloutConfig.model_validate({"model": "m", **yaml.safe_load(config_map["data"]["rollout.yaml"])})
    assert config.max_adapter_runs >= len(pools) and config.max_loras >= len(pools)
    run_defaults = next(o for o in objs if o["kind"] == "ConfigMap" and "run-defaults.yaml" in o.get("data", {}))
    assert yaml.safe_load(run_defaults["data"]["run-defaults.yaml"])["colocated"] is False  # replicas are shared
