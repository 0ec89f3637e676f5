"""A service imports only shared code (`services.common`) and the generated stubs, never another
service's modules (docs/architecture.md, "Services"): read from each module's import statements."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").is_file() and p.name != "common")


def _imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module `path` imports, relative imports resolved; `from a import b` counts as `a.b` too."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _imported_services(path: Path, root: Path = ROOT) -> set[str]:
    return {name.split(".")[1] for name in _imported_modules(path, root) if name.startswith("services.")}


def test_imports_are_read_in_every_form(tmp_path: Path) -> None:
    module = tmp_path / "services" / "coordinator" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text("import services.env.spec\nfrom services import rollout\nfrom ..learner import driver\n"
                      "from . import store\n")
    assert _imported_services(module, tmp_path) == {"env", "rollout", "learner", "coordinator"}


def test_no_service_imports_another_services_modules() -> None:
    assert SERVICES == ["coordinator", "env", "learner", "rollout"]
    crossings = {
        f"{path.relative_to(ROOT)} imports services.{other}"
        for service in SERVICES
        for path in (ROOT / "services" / service).rglob("*.py")
        for other in _imported_services(path) - {service, "common"}
    }
    assert not crossings, sorted(crossings)


def test_shared_code_imports_no_service() -> None:
    crossings = {
        f"{path.relative_to(ROOT)} imports services.{other}"
        for path in (ROOT / "services" / "common").rglob("*.py")
        for other in _imported_services(path) - {"common"}
    }
    assert not crossings, sorted(crossings)


def test_only_the_coordinators_clients_speak_protobuf() -> None:
    """The run loop and what it calls read and build plain dataclasses (services/coordinator/wire.py);
    the generated `*_pb2` messages stay in clients.py."""
    speaking = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "services" / "coordinator").rglob("*.py")
        if any(name.startswith("mmrl.v1") for name in _imported_modules(path))
    }
    assert speaking == {"services/coordinator/clients.py"}


def test_the_coordinator_knows_no_environment() -> None:
    """Everything a run needs from an environment comes over EnvService (GetEnvInfo, GetTrainingTasks,
    GetEvalSet, episodes): no coordinator module imports the maze's code."""
    knowing = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in (ROOT / "services" / "coordinator").rglob("*.py")
        for name in _imported_modules(path)
        if name.startswith(("services.common.maze", "services.env"))
    }
    assert not knowing, sorted(knowing)
