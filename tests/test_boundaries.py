"""The rooms of the code and who may import whom (docs/architecture.md "Where the code lives"), read from
every module's import statements (TYPE_CHECKING imports included):

    mmrl (CLI, offline jobs) -> services.{coordinator, env, learner, rollout} -> services.common -> mmrl_proto

A service imports only shared code and the generated stubs, never another service; nothing imports
upwards; the import graph has no cycle; no module is longer than 400 lines."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").is_file() and p.name != "common")
PACKAGES = ("mmrl", "mmrl_proto", "services")


def _module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


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


def _modules(root: Path = ROOT) -> dict[str, Path]:
    return {_module_name(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")
            if (root / package).is_dir()}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    modules = _modules(root)
    return {name: {m for m in _imported_modules(path, root) if m in modules and m != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _room(module: str) -> str:
    """mmrl_proto, services.common, services.<service> or mmrl."""
    parts = module.split(".")
    if parts[0] == "services":
        return ".".join(parts[:2])
    return parts[0]


ALLOWED = {  # room -> the rooms it may import besides its own
    "mmrl_proto": set(),
    "services.common": {"mmrl_proto"},
    **{f"services.{s}": {"mmrl_proto", "services.common"} for s in ["coordinator", "env", "learner", "rollout"]},
    "mmrl": {"mmrl_proto", "services.common", "services.coordinator", "services.env", "services.learner",
             "services.rollout"},
}


def crossings(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                  if _room(b) != _room(a) and _room(b) not in ALLOWED.get(_room(a), set()))


def test_imports_are_read_in_every_form(tmp_path: Path) -> None:
    module = tmp_path / "services" / "coordinator" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text("import services.env.spec\nfrom services import rollout\nfrom ..learner import driver\n"
                      "from . import store\n")
    assert {".".join(n.split(".")[:2]) for n in _imported_modules(module, tmp_path)
            if n.startswith("services.")} == {"services.env", "services.rollout", "services.learner",
                                              "services.coordinator"}


def test_the_rooms_are_the_ones_named() -> None:
    assert SERVICES == ["coordinator", "env", "learner", "rollout"]
    assert {_room(m) for m in import_graph() if m != "services"} == set(ALLOWED)


def test_no_room_imports_one_it_may_not() -> None:
    """Services never import each other or the CLI; shared code imports no service; the stubs nothing."""
    assert not crossings(import_graph())


def test_a_service_importing_another_or_the_cli_is_caught(tmp_path: Path) -> None:
    for package, text in (("services/env", "from services.coordinator.config import RunConfig\n"),
                          ("services/learner", "import mmrl.sft.train\n"),
                          ("services/common", "from services.env.kit import seeds\n")):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "probe.py").write_text(text)
    for target in ("services/coordinator/config.py", "mmrl/sft/train.py", "services/env/kit/seeds.py"):
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target).write_text("")
    assert len(crossings(import_graph(tmp_path))) == 3


def test_the_import_graph_has_no_cycle() -> None:
    assert not cycles(import_graph())


def test_a_cycle_is_caught() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_coordinators_clients_speak_protobuf() -> None:
    """The run loop and what it calls read and build plain dataclasses (ops/wire.py); the generated
    `*_pb2` messages stay in ops/clients.py."""
    speaking = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "services" / "coordinator").rglob("*.py")
        if any(name.startswith("mmrl_proto") for name in _imported_modules(path))
    }
    assert speaking == {"services/coordinator/ops/clients.py"}


def test_the_algorithm_imports_no_operations_but_the_clients_types() -> None:
    """coordinator/grpo is GRPO: it calls services through `Services` and records through the store, and
    reads nothing else of coordinator/ops."""
    graph = import_graph()
    used = {b for a, targets in graph.items() if a.startswith("services.coordinator.grpo")
            for b in targets if b.startswith("services.coordinator.ops")}
    assert used <= {"services.coordinator.ops.replicas", "services.coordinator.ops.wire",
                    "services.coordinator.ops.store", "services.coordinator.ops.clients"}


def test_nothing_outside_the_env_service_knows_an_environment() -> None:
    """Environments are the env service's: the coordinator, learner and rollout import none, and the
    command line reaches them through the registry (plus the benchmarks of one environment's episodes)."""
    graph = import_graph()
    knowing = sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                     if b.startswith(("services.env.maze", "services.env.sokoban"))
                     and not a.startswith("services.env")
                     and a not in {"mmrl.bench.env", "mmrl.bench.synthetic"})
    assert not knowing, knowing


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_longer_than_400_lines(package: str) -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / package).rglob("*.py")
            if "_pb2" not in p.name and (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_every_import_graph_edge_points_down() -> None:
    """An arrow from a service up into the CLI would be a crossing too: none."""
    graph = import_graph()
    assert not [a for a, targets in graph.items() if a.startswith("services.")
                for b in targets if b.startswith("mmrl.")]
    assert sum(len(t) for t in graph.values()) > 500  # the graph was read
    assert len(defaultdict(set, graph)) > 150
