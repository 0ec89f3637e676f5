"""A service imports only shared code (`services.common`) and the generated stubs, never another
service's modules (ARCHITECTURE, "Boundaries"): read from each module's import statements."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").is_file() and p.name != "common")


def _imported_services(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name.split(".")[1] for name in names if name.startswith("services.") and name.count(".") >= 1}


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
