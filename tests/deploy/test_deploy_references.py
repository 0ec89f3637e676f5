"""Every Secret, ConfigMap, PersistentVolumeClaim and ServiceAccount that a pod of a rendered overlay
references exists once the overlay's README steps are followed: the overlay renders it, or a
`kubectl create ...` / `kubectl apply -f FILE` line of that overlay's section of
deploy/k8s/README.md makes it. A reference marked `optional: true` needs neither."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from deploy_contract import K8S_DIR, REPO_ROOT, find, load_yaml_documents, pod_spec, workloads

Manifests = dict[str, list[dict[str, Any]]]
README = K8S_DIR / "README.md"
# The section of deploy/k8s/README.md that sets each overlay up.
SECTIONS = {"local": "## Local cluster", "hyperpod": "## HyperPod (EKS) step by step"}
CREATE_KINDS = {"secret": "Secret", "configmap": "ConfigMap", "serviceaccount": "ServiceAccount",
                "sa": "ServiceAccount"}
Ref = tuple[str, str]  # (kind, name)


def references(obj: dict[str, Any]) -> set[Ref]:
    """What the pods of a workload need to exist, optional references left out."""
    spec = pod_spec(obj) or {}
    refs: set[Ref] = set()
    if spec.get("serviceAccountName", "default") != "default":
        refs.add(("ServiceAccount", spec["serviceAccountName"]))
    refs |= {("Secret", s["name"]) for s in spec.get("imagePullSecrets", [])}
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for source in c.get("envFrom", []):
            for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                if key in source and not source[key].get("optional"):
                    refs.add((kind, source[key]["name"]))
        for env in c.get("env", []):
            for key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
                ref = env.get("valueFrom", {}).get(key)
                if ref and not ref.get("optional"):
                    refs.add((kind, ref["name"]))
    claim_templates = {t["metadata"]["name"] for t in obj.get("spec", {}).get("volumeClaimTemplates", [])}
    for volume in spec.get("volumes", []):
        sources = [volume, *volume.get("projected", {}).get("sources", [])]
        for source in sources:
            if "secret" in source and not source["secret"].get("optional"):
                refs.add(("Secret", source["secret"].get("secretName") or source["secret"]["name"]))
            if "configMap" in source and not source["configMap"].get("optional"):
                refs.add(("ConfigMap", source["configMap"]["name"]))
        if "persistentVolumeClaim" in volume and volume["name"] not in claim_templates:
            refs.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
    return refs


def readme_section(text: str, heading: str) -> str:
    """From the `## ...` heading that starts with `heading` to the next one."""
    start = text.index(f"\n{heading}")
    end = text.find("\n## ", start + len(heading) + 1)
    return text[start: end if end >= 0 else len(text)]


NAMESPACE = r"(?:\s+(?:-n|--namespace)[= ]\S+)*"
CREATE = re.compile(rf"\bkubectl{NAMESPACE}\s+create\s+(secret\s+\S+|configmap|serviceaccount|sa)\s+([\w.-]+)")
APPLY = re.compile(rf"\bkubectl{NAMESPACE}\s+apply\s+-f\s+(\S+)")


def created_by_steps(section: str, root: Path = REPO_ROOT) -> set[Ref]:
    """The objects the section's `kubectl create KIND NAME` and `kubectl apply -f FILE` lines make."""
    made: set[Ref] = set()
    for line in section.splitlines():
        if match := CREATE.search(line):
            made.add((CREATE_KINDS[match.group(1).split()[0]], match.group(2)))
        if match := APPLY.search(line):
            path = root / match.group(1)
            made |= {(o["kind"], o["metadata"]["name"]) for o in load_yaml_documents(path.read_text())}
    return made


def unmet(objs: list[dict[str, Any]], section: str) -> dict[str, set[Ref]]:
    """Workload -> the references nothing makes."""
    made = {(o["kind"], o["metadata"]["name"]) for o in objs} | created_by_steps(section)
    missing = {f"{o['kind']}/{o['metadata']['name']}": references(o) - made for o in workloads(objs)}
    return {name: refs for name, refs in missing.items() if refs}


@pytest.mark.parametrize("overlay", SECTIONS)
def test_everything_a_pod_references_is_rendered_or_created_by_the_readme_steps(
    manifests: Manifests, overlay: str
) -> None:
    section = readme_section(README.read_text(), SECTIONS[overlay])
    assert not unmet(manifests[overlay], section), unmet(manifests[overlay], section)
    needed = set().union(*(references(o) for o in workloads(manifests[overlay])))
    assert {kind for kind, _ in needed} >= {"Secret", "ConfigMap", "PersistentVolumeClaim", "ServiceAccount"}


def test_the_hyperpod_steps_create_both_token_secrets() -> None:
    made = created_by_steps(readme_section(README.read_text(), SECTIONS["hyperpod"]))
    assert {("Secret", "mmrl-api-token"), ("Secret", "mmrl-grpc-token")} <= made


def _without_line(section: str, pattern: str) -> str:
    return "\n".join(line for line in section.splitlines() if not re.search(pattern, line))


@pytest.mark.parametrize("breakage", ["extra secretRef", "readme without the grpc token", "unknown account"])
def test_a_reference_nothing_makes_fails_the_check(manifests: Manifests, breakage: str) -> None:
    objs = copy.deepcopy(manifests["hyperpod"])
    section = readme_section(README.read_text(), SECTIONS["hyperpod"])
    coordinator = find(objs, "Deployment", "coordinator")
    if breakage == "extra secretRef":
        coordinator["spec"]["template"]["spec"]["containers"][0]["envFrom"].append({"secretRef": {"name": "mmrl-extra"}})
        expected = {("Secret", "mmrl-extra")}
    elif breakage == "readme without the grpc token":
        section = _without_line(section, r"create secret generic mmrl-grpc-token")
        expected = {("Secret", "mmrl-grpc-token")}
    else:
        coordinator["spec"]["template"]["spec"]["serviceAccountName"] = "mmrl-elsewhere"
        expected = {("ServiceAccount", "mmrl-elsewhere")}
    assert unmet(objs, section).get("Deployment/coordinator", set()) >= expected
