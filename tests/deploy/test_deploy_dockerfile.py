"""Static lint of deploy/docker/Dockerfile and .dockerignore: one Debian base, pinned packages, a
non-root user, health checks and commands on the contract ports, no build tools where nothing
compiles, and the package CA only as a build secret."""

from __future__ import annotations

import json
import re

import pytest
from deploy_contract import (
    CONTRACT_PORTS,
    REDIS_TARGET,
    REPO_ROOT,
    SERVICE_TARGETS,
    Stage,
    dockerfile_global_args,
    dockerfile_stages,
    stage_chain,
)

STAGES = dockerfile_stages()
GLOBAL_ARGS = dockerfile_global_args()
IMAGE_TARGETS = (*SERVICE_TARGETS, REDIS_TARGET)
# Images that never compile anything at runtime: not even a compiler in them.
NO_COMPILER_TARGETS = ("env", "coordinator", REDIS_TARGET)
BUILD_TOOLS = re.compile(r"\b(build-essential|make|cmake|git|curl|wget|[\w.+-]+-dev)\b")
# The trust store follows the archive's updates; every other Debian package is pinned.
UNPINNED_PACKAGES = ("ca-certificates",)


def _last(chain: list[Stage], instruction: str) -> str | None:
    values = [value for stage in chain for value in stage.values(instruction)]
    return values[-1] if values else None


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"use the exec (JSON) form: {value}"
    return parsed


def test_every_image_starts_from_the_one_base_argument_debian_bookworm_with_its_python_3_11() -> None:
    assert GLOBAL_ARGS["BASE_IMAGE"] == "debian:bookworm-slim"
    assert GLOBAL_ARGS["EFA_IMAGE"] in STAGES, "by default the EFA stage is one of this file's"
    for stage in STAGES.values():
        assert stage.base in STAGES or stage.base in ("${BASE_IMAGE}", "${EFA_IMAGE}"), f"{stage.name}: FROM {stage.base}"
    assert re.fullmatch(r"python3=3\.11\.[\w.:~+-]+", GLOBAL_ARGS["PYTHON_PACKAGES"])


def test_every_image_target_exists_and_runs_as_a_non_root_user() -> None:
    for target in IMAGE_TARGETS:
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


def test_redis_serves_its_contract_port_with_an_append_only_file_in_data() -> None:
    chain = stage_chain(STAGES, REDIS_TARGET)
    assert _last(chain, "ENTRYPOINT") is None
    command = _exec_form(_last(chain, "CMD") or "null")
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--dir") + 1] == "/data"
    assert str(CONTRACT_PORTS["redis"]) in (_last(chain, "EXPOSE") or "").split()
    assert "redis-cli ping" in (_last(chain, "HEALTHCHECK") or "")


def test_gpu_targets_run_the_cuda_stack_cpu_targets_the_cpu_stack_and_env_and_coordinator_neither() -> None:
    for target in SERVICE_TARGETS:
        chain = stage_chain(STAGES, target)
        venvs = {
            v.split()[0] for stage in chain for v in stage.values("COPY") if v.startswith("--from=venv-")
        }
        flavour = target.rpartition("-")[2] if target.endswith(("-cpu", "-gpu")) else None
        assert venvs == {{"gpu": "--from=venv-gpu", "cpu": "--from=venv-cpu"}.get(flavour or "", "--from=venv-light")}
        if flavour:
            command = _exec_form(_last(chain, "CMD") or "null")
            model = "Qwen3-VL-8B-Instruct" if flavour == "gpu" else "tiny"
            assert command[command.index("--model") + 1] == f"/shared/models/{model}", target
    assert "image-requirements.py light >/wheels-light.txt" in " ".join(STAGES["wheel"].values("RUN"))
    assert "/tmp/wheels-light.txt" in " ".join(STAGES["venv-light"].values("RUN"))
    check = " ".join(STAGES["light"].values("RUN"))
    assert "heavy = {'torch', 'vllm', 'peft'} & set(sys.modules)" in check, "the light image proves it"


def _apt_packages(run: str) -> list[str]:
    """The packages an `apt-get install` names, each $ARG expanded to its default."""
    words = re.search(r"apt-get install ([^&]*)", run)
    assert words, run
    packages = []
    for word in words.group(1).split():
        if word.startswith("$"):
            packages += GLOBAL_ARGS[word[1:]].split()
        elif not word.startswith("-"):
            packages.append(word)
    return packages


def test_no_image_installs_build_tools_and_every_debian_package_is_pinned() -> None:
    """The runtime JIT's compilers and Python headers (JIT_PACKAGES) are the one exception."""
    jit = GLOBAL_ARGS["JIT_PACKAGES"].split()
    assert {p.partition("=")[0] for p in jit} >= {"gcc", "g++", "libpython3.11-dev"}
    assert not [p for p in jit if re.search(r"\b(build-essential|make|cmake|git|curl|wget)\b", p)]
    for target in IMAGE_TARGETS:
        packages = [
            p
            for stage in stage_chain(STAGES, target)
            for run in stage.values("RUN")
            if "apt-get install" in run
            for p in _apt_packages(run)
        ]
        assert packages, f"{target} installs its Python or Redis from Debian"
        assert not any(BUILD_TOOLS.search(p.partition("=")[0]) for p in packages if p not in jit), target
        for package in packages:
            assert package in UNPINNED_PACKAGES or re.fullmatch(r"[\w.+-]+=[\w.:~+*-]+", package), package
        compilers = [p for p in packages if p.startswith(("gcc", "g++"))]
        assert bool(compilers) == (target not in NO_COMPILER_TARGETS), target


def test_the_package_ca_reaches_pip_only_as_a_build_secret_in_build_stages() -> None:
    build_stages = {name for name in STAGES if "build" in [s.name for s in stage_chain(STAGES, name)]}
    for name, stage in STAGES.items():
        for run in stage.values("RUN"):
            if "pip install" not in run or "pip install --no-deps /wheels/*.whl" in run:
                continue  # no download: the mmrl wheel alone
            assert name in build_stages, name
            assert run.startswith("--mount=type=secret,id=package-ca "), run
            assert "with-package-ca pip install" in run, run
        assert not re.search(r"CERT|CA_BUNDLE|package-ca", " ".join(stage.values("ENV") + stage.values("ARG")))
    for target in IMAGE_TARGETS:
        assert not {s.name for s in stage_chain(STAGES, target)} & build_stages, f"{target} is built on a build stage"


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
