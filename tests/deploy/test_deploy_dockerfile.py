"""Static lint of deploy/docker/Dockerfile and .dockerignore: pinned bases and packages, a non-root user,
health checks and commands on the contract ports, no build tools where nothing compiles."""

from __future__ import annotations

import json
import re

import pytest
from deploy_contract import (
    CONTRACT_PORTS,
    REPO_ROOT,
    SERVICE_TARGETS,
    Stage,
    dockerfile_global_args,
    dockerfile_stages,
    stage_chain,
)

STAGES = dockerfile_stages()
# Images that never compile anything at runtime: not even a compiler in them.
NO_COMPILER_TARGETS = ("env", "coordinator")
BUILD_TOOLS = re.compile(r"\b(build-essential|make|cmake|git|curl|wget|[\w.+-]+-dev)\b")


def _last(chain: list[Stage], instruction: str) -> str | None:
    values = [value for stage in chain for value in stage.values(instruction)]
    return values[-1] if values else None


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"use the exec (JSON) form: {value}"
    return parsed


def test_every_base_image_is_pinned_to_an_exact_version_tag() -> None:
    for stage in STAGES.values():
        if stage.base in STAGES:
            continue
        image, _, tag = stage.base.rpartition(":")
        assert image and "/" not in tag, f"{stage.name}: FROM {stage.base} has no tag"
        assert re.match(r"\d+\.\d+\.\d+", tag), f"{stage.name}: FROM {stage.base} is not an exact version"


def test_every_service_target_exists_and_runs_as_a_non_root_user() -> None:
    for target in SERVICE_TARGETS:
        user = _last(stage_chain(STAGES, target), "USER")
        assert user is not None, f"{target} runs as root"
        assert user.split(":")[0] not in ("root", "0"), f"{target} runs as {user}"


@pytest.mark.parametrize("target", SERVICE_TARGETS)
def test_every_service_target_serves_and_health_checks_its_contract_port(target: str) -> None:
    service = SERVICE_TARGETS[target]
    port = CONTRACT_PORTS[service]
    chain = stage_chain(STAGES, target)
    assert _exec_form(_last(chain, "ENTRYPOINT") or "null") == ["mmrl"]
    command = _exec_form(_last(chain, "CMD") or "null")
    assert command[:2] == ["serve", service]
    assert command[command.index("--port") + 1] == str(port)
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert str(port) in (_last(chain, "EXPOSE") or "").split()
    healthcheck = _last(chain, "HEALTHCHECK")
    assert healthcheck is not None, f"{target} has no HEALTHCHECK"
    probe = " ".join(_exec_form(healthcheck.split(" CMD ", 1)[1]))
    if service == "coordinator":
        assert f"http://localhost:{port}/healthz" in probe
    else:
        assert probe == f"python -m services.common.healthcheck localhost:{port}"


def test_gpu_targets_run_the_cuda_stack_and_cpu_targets_the_cpu_stack_with_their_models() -> None:
    for target in SERVICE_TARGETS:
        chain = stage_chain(STAGES, target)
        venvs = {
            v.split()[0] for stage in chain for v in stage.values("COPY") if v.startswith("--from=venv-")
        }
        flavour = target.rpartition("-")[2] if target.endswith(("-cpu", "-gpu")) else None
        expected = {"gpu": "--from=venv-gpu", "cpu": "--from=venv-cpu"}.get(flavour or "")
        if expected:
            assert venvs == {expected}, target
            command = _exec_form(_last(chain, "CMD") or "null")
            model = "Qwen3-VL-8B-Instruct" if flavour == "gpu" else "tiny"
            assert command[command.index("--model") + 1] == f"/shared/models/{model}", target
    assert "--from=venv-env" in stage_chain(STAGES, "env")[-1].values("COPY")[0]


def test_no_image_installs_build_tools_and_env_and_coordinator_carry_no_compiler() -> None:
    jit_packages = dockerfile_global_args()["JIT_PACKAGES"].split()
    assert jit_packages, "JIT_PACKAGES lists the runtime compilers"
    assert all(re.fullmatch(r"[\w.+-]+=[\w.:~+-]+", p) for p in jit_packages), "apt packages are pinned"
    for target in SERVICE_TARGETS:
        runs = " ".join(v for stage in stage_chain(STAGES, target) for v in stage.values("RUN"))
        assert not BUILD_TOOLS.search(runs.replace("$JIT_PACKAGES", " ".join(jit_packages))), target
        if target in NO_COMPILER_TARGETS:
            assert "apt-get install" not in runs, f"{target} installs system packages"
    for stage in STAGES.values():
        assert not BUILD_TOOLS.search(" ".join(stage.values("RUN"))), stage.name


def test_every_pip_install_is_pinned_by_a_constraints_file_or_an_exact_version() -> None:
    installs = [
        command.strip()
        for stage in STAGES.values()
        for run in stage.values("RUN")
        for command in run.split("&&")
        if "pip install" in command
    ]
    assert installs
    for command in installs:
        if "--no-deps" in command:
            assert re.search(r"==\d|/wheels/\*\.whl", command), command
        else:
            assert re.search(r"-c \S*constraints\S*\.txt", command), command


def test_gpu_constraints_pin_the_same_torch_and_model_stack_as_the_cpu_constraints() -> None:
    def pins(path: str) -> dict[str, str]:
        lines = (REPO_ROOT / path).read_text().splitlines()
        pairs = (re.split(r"===?", line, maxsplit=1) for line in lines if re.match(r"[A-Za-z]", line))
        return {name.lower(): version for name, version in pairs}

    cpu, gpu = pins("requirements/constraints.txt"), pins("deploy/docker/constraints-gpu.txt")
    assert gpu["vllm"] == "0.32.0"
    for package in ("torch", "torchvision", "transformers", "peft", "safetensors"):
        assert gpu[package] == cpu[package], package


def test_the_build_context_keeps_secrets_and_local_state_out() -> None:
    lines = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", ".dockerignore is an allowlist"
    included = [line[1:] for line in lines if line.startswith("!")]
    assert not any(path.startswith((".env", ".venv", ".git")) for path in included)
    copied = {
        source.rstrip("/")
        for stage in STAGES.values()
        for value in stage.values("COPY")
        if not value.startswith("--from")
        for source in value.split()[:-1]
    }
    for source in copied:
        assert any(source == path.rstrip("/") for path in included), f"COPY {source} is not in the context"
    assert copied, "the Dockerfile copies something from the context"
