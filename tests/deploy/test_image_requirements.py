"""deploy/docker/image-requirements.py: what each image flavour installs, and the light images' import
check (the Dockerfile's `light` stage) run here without Docker: every module of env and coordinator
imports with only the packages the light requirements bring in, and none loads torch, vLLM or peft."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from importlib import metadata
from types import ModuleType

import pytest
from deploy_contract import REPO_ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SCRIPT = REPO_ROOT / "deploy" / "docker" / "image-requirements.py"
PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]

# The light stage's check, with a finder first on sys.meta_path that refuses every installed
# top-level module outside ALLOWED (a JSON list on stdin): as in an image without those packages.
CHECK = """
import importlib, importlib.abc, importlib.machinery, json, pkgutil, site, sys
allowed = set(json.load(sys.stdin)) | set(sys.modules)
installed = tuple(site.getsitepackages())
class NotInImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if path is not None or name in allowed:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name)
        where = [spec.origin or "", *(spec.submodule_search_locations or [])] if spec else []
        if any(place.startswith(installed) for place in where):
            raise ModuleNotFoundError(f"No module named {name!r} (not in the light image)", name=name)
        return None
sys.meta_path.insert(0, NotInImage())
import services.coordinator as c, services.env as e
for package in (c, e):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
heavy = {"torch", "vllm", "peft"} & set(sys.modules)
assert not heavy, heavy
"""


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_requirements", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _names(lines: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(line).name) for line in lines}


def _closure(lines: list[str]) -> set[str]:
    """The distributions `pip install` of these requirement lines brings in, read from what is
    installed here (the same pins: requirements/constraints.txt)."""
    todo = [Requirement(line) for line in lines]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        extras = {""} | set(requirement.extras)
        if name in seen and not requirement.extras:
            continue
        seen.add(name)
        for line in metadata.distribution(requirement.name).requires or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                needed.marker = None
                todo.append(needed)
    return seen


def _top_level_modules(distributions: set[str]) -> set[str]:
    return {
        module
        for module, names in metadata.packages_distributions().items()
        if any(canonicalize_name(name) in distributions for name in names)
    }


def test_light_leaves_out_torch_and_the_demo_plots_and_adds_the_env_services_extras() -> None:
    script = _load_script()
    every, light = (_names(script.image_requirements(PROJECT, flavour)) for flavour in ("all", "light"))
    extras = PROJECT["optional-dependencies"]
    assert _names(PROJECT["dependencies"] + extras["tracing"]) == every
    assert {"peft", "matplotlib"} <= every and not {"peft", "matplotlib"} & light
    assert _names(extras["gym"] + extras["openenv"] + extras["tracing"]) <= light
    assert "torch" not in _closure(script.image_requirements(PROJECT, "light"))
    with pytest.raises(ValueError, match="flavour must be one of"):
        script.image_requirements(PROJECT, "heavy")


def test_the_script_prints_one_requirement_per_line_and_refuses_an_unknown_flavour() -> None:
    run = [sys.executable, str(SCRIPT)]
    printed = subprocess.run([*run, "light", str(REPO_ROOT / "pyproject.toml")], capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == _load_script().image_requirements(PROJECT, "light")
    refused = subprocess.run([*run, "gpu"], capture_output=True, text=True)
    assert refused.returncode == 2 and "all|light" in refused.stderr


def _light_check(lines: list[str]) -> subprocess.CompletedProcess[str]:
    """CHECK in a fresh interpreter, allowed what these requirement lines install and mmrl's own packages."""
    allowed = _top_level_modules(_closure(lines)) | {"services", "mmrl", "mmrl_proto"}
    return subprocess.run(
        [sys.executable, "-c", CHECK], input=json.dumps(sorted(allowed)), capture_output=True, text=True, cwd=REPO_ROOT
    )


def test_every_env_and_coordinator_module_imports_with_only_the_light_requirements() -> None:
    result = _light_check(_load_script().image_requirements(PROJECT, "light"))
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_check_fails_when_a_module_needs_a_package_the_light_image_lacks() -> None:
    """Without the openenv extra, services/env/openenv/served.py cannot import."""
    lines = [line for line in _load_script().image_requirements(PROJECT, "light") if not line.startswith("openenv")]
    result = _light_check(lines)
    assert result.returncode != 0
    assert "No module named 'openenv' (not in the light image)" in result.stderr
