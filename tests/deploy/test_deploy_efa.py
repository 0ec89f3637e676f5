"""EFA on HyperPod, checked statically: the learner pods request the nodes' EFA devices and set
libfabric's and NCCL's variables, the GPU images carry libfabric and rdma-core's EFA driver and take
AWS's aws-ofi-nccl plugin from the EFA_IMAGE build argument, and the learner keeps its frozen base
whole on every GPU (--replicate-base), so only LoRA weights cross the network."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from deploy_contract import (
    DOCKERFILE,
    Stage,
    container,
    containers,
    dockerfile_global_args,
    dockerfile_stages,
    find,
    stage_chain,
    workloads,
)

Manifests = dict[str, list[dict[str, Any]]]
EFA = "vpc.amazonaws.com/efa"
# What libfabric and NCCL must be told on the learner containers.
EFA_ENV = {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi"}
EFA_DEBIAN_PACKAGES = {"libfabric1", "ibverbs-providers", "libibverbs1"}
PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib")


def pod_problems(objs: list[dict[str, Any]]) -> list[str]:
    """What keeps the HyperPod learner off EFA (empty: nothing)."""
    learner = container(find(objs, "StatefulSet", "learner"), "learner")
    problems = []
    requests, limits = (learner["resources"].get(k, {}) for k in ("requests", "limits"))
    if not int(requests.get(EFA, 0)) >= 1 or requests.get(EFA) != limits.get(EFA):
        problems.append(f"the learner requests no {EFA} (requests {requests.get(EFA)}, limits {limits.get(EFA)})")
    env = {e["name"]: e.get("value") for e in learner.get("env", [])}
    problems += [f"{name}={env.get(name)}, not {value}" for name, value in EFA_ENV.items() if env.get(name) != value]
    if "--replicate-base" not in learner["args"]:
        problems.append("the learner shards the frozen base (no --replicate-base)")
    others = [c["name"] for obj in workloads(objs) for c in containers(obj)
              if c is not learner and EFA in c.get("resources", {}).get("requests", {})]
    if others:
        problems.append(f"only the learner needs EFA, not {others}")
    return problems


def image_problems(stages: dict[str, Stage], global_args: dict[str, str]) -> list[str]:
    """What the GPU images lack for EFA (empty: nothing)."""
    problems = []
    for target in ("rollout-gpu", "learner-gpu"):
        chain = stage_chain(stages, target)
        installs = " ".join(r for s in chain for r in s.values("RUN") if "apt-get install" in r)
        packages = {p.partition("=")[0] for word in installs.split() if word.startswith("$")
                    for p in global_args.get(word[1:], "").split()}
        if not EFA_DEBIAN_PACKAGES <= packages:
            problems.append(f"{target} does not install {sorted(EFA_DEBIAN_PACKAGES - packages)}")
        if not any(v.startswith("--from=efa /opt/amazon") for s in chain for v in s.values("COPY")):
            problems.append(f"{target} does not copy /opt/amazon from the EFA_IMAGE stage")
        env = " ".join(v for s in chain for v in s.values("ENV"))
        problems += [f"{target}: {d} not on LD_LIBRARY_PATH" for d in PLUGIN_DIRS if d not in env]
    efa = stages.get("efa")
    if efa is None or efa.base != "${EFA_IMAGE}" or global_args.get("EFA_IMAGE") not in stages:
        problems.append("no stage `efa` FROM ${EFA_IMAGE} with a default stage of this file")
    for target in ("rollout-cpu", "learner-cpu", "env", "coordinator"):
        if any("EFA_PACKAGES" in r for s in stage_chain(stages, target) for r in s.values("RUN")):
            problems.append(f"{target} installs EFA packages it cannot use")
    return problems


def test_the_hyperpod_learner_requests_efa_and_tells_libfabric_and_nccl(manifests: Manifests) -> None:
    assert pod_problems(manifests["hyperpod"]) == []


def test_the_gpu_images_carry_libfabric_and_take_the_nccl_plugin_from_a_build_argument() -> None:
    assert image_problems(dockerfile_stages(), dockerfile_global_args()) == []


def test_the_deploy_readme_says_what_the_default_gpu_image_lacks() -> None:
    readme = (DOCKERFILE.parents[1] / "README.md").read_text()
    assert "EFA_IMAGE" in readme and "aws-ofi-nccl" in readme and "TCP" in readme


@pytest.mark.parametrize("breakage", ["no efa request", "no FI_PROVIDER", "no --replicate-base"])
def test_a_learner_pod_without_efa_fails_the_check(manifests: Manifests, breakage: str) -> None:
    objs = copy.deepcopy(manifests["hyperpod"])
    learner = container(find(objs, "StatefulSet", "learner"), "learner")
    if breakage == "no efa request":
        del learner["resources"]["requests"][EFA]
    elif breakage == "no FI_PROVIDER":
        learner["env"] = [e for e in learner["env"] if e["name"] != "FI_PROVIDER"]
    else:
        learner["args"].remove("--replicate-base")
    assert len(pod_problems(objs)) == 1, pod_problems(objs)


@pytest.mark.parametrize("breakage", ["no libfabric", "no plugin copy"])
def test_a_gpu_image_without_efa_fails_the_check(breakage: str) -> None:
    stages, global_args = dockerfile_stages(), dockerfile_global_args()
    if breakage == "no libfabric":
        global_args["EFA_PACKAGES"] = " ".join(p for p in global_args["EFA_PACKAGES"].split()
                                               if not p.startswith("libfabric1"))
    else:
        gpu = stages["gpu"]
        gpu.instructions = [(i, v) for i, v in gpu.instructions if not v.startswith("--from=efa")]
    assert len(image_problems(stages, global_args)) == 2, image_problems(stages, global_args)
