"""Every `MMRL_*` environment variable the code reads is in docs/configuration.md ("every setting").

Found by reading the source, not by importing it: each string literal that is a whole variable name
(`os.environ.get("MMRL_X")`, an alias of a settings field, a constant), and each field of a
pydantic-settings class with an `MMRL_` `env_prefix`."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
PACKAGES = ("services", "mmrl")
GENERATED = ROOT / "mmrl" / "v1"  # protoc's output reads no variable
NAME = re.compile(r"MMRL_[A-Z0-9_]*[A-Z0-9]")


def _env_prefix(node: ast.ClassDef) -> str | None:
    for statement in node.body:
        if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call)
                and any(isinstance(t, ast.Name) and t.id == "model_config" for t in statement.targets)):
            for keyword in statement.value.keywords:
                if keyword.arg == "env_prefix" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return None


def _aliased(field: ast.AnnAssign) -> bool:
    """A field read under an alias (its names are literals, found as such), not prefix + name."""
    return isinstance(field.value, ast.Call) and any(
        k.arg in ("alias", "validation_alias") for k in field.value.keywords)


def variables_read(source: str) -> set[str]:
    """The MMRL_* names a module's code uses: literals that are a whole name, and settings fields."""
    tree = ast.parse(source)
    names = {node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (prefix := _env_prefix(node)) and prefix.startswith("MMRL_"):
            names |= {(prefix + s.target.id).upper() for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and not _aliased(s)}
    return names


def sources() -> Iterable[Path]:
    for package in PACKAGES:
        yield from (p for p in sorted((ROOT / package).rglob("*.py")) if GENERATED not in p.parents)


def undocumented(page: str, files: Iterable[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Variable -> the files that read it, for each variable the page does not name."""
    missing: dict[str, list[str]] = {}
    for path in files:
        for name in variables_read(path.read_text()):
            if f"`{name}`" not in page:
                missing.setdefault(name, []).append(str(path.relative_to(root)))
    return missing


def test_every_mmrl_variable_the_code_reads_is_in_the_configuration_reference() -> None:
    files = list(sources())
    assert len(files) > 50
    found = set().union(*(variables_read(p.read_text()) for p in files))
    assert {"MMRL_GRPC_TOKEN", "MMRL_TRIGGER_RULES_FILE", "MMRL_REDIS_URL", "MMRL_API_URL"} <= found
    missing = undocumented(PAGE.read_text(), files)
    assert not missing, f"read by the code but not in docs/configuration.md: {missing}"


@pytest.mark.parametrize("code", [
    'import os\nURL = os.environ.get("MMRL_UNDOCUMENTED_X", "")\n',
    'from pydantic_settings import BaseSettings, SettingsConfigDict\n\n'
    'class S(BaseSettings):\n    model_config = SettingsConfigDict(env_prefix="MMRL_UNDOCUMENTED_")\n    x: int = 1\n',
])
def test_a_variable_missing_from_the_page_fails_the_check(code: str, tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(code)
    missing = undocumented(PAGE.read_text(), [probe], root=tmp_path)
    assert missing == {"MMRL_UNDOCUMENTED_X": ["probe.py"]}, missing
