"""Citations of a doc's section, `docs/X.md, "Section"`, in code, tests and docs name a heading
that exists in that file, and nothing cites a design document that is not in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"(docs/[\w/.-]+\.md),\s+\"([^\"]+)\"")
# The design notes are cited as the repository's docs/architecture.md, never by a bare upper-case
# name (which points at a copy outside the repository).
DESIGN_DOC = ROOT / "docs" / "architecture.md"
FORBIDDEN = re.compile(rf"\b{DESIGN_DOC.stem.upper()}\b(?!\.md\b)")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ""}


def tracked_text_files() -> list[Path]:
    """Every tracked text file but the generated stubs and this test (its examples are broken on purpose)."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / n for n in names.split() if Path(n).suffix in TEXT_SUFFIXES and (ROOT / n).is_file()
            and not n.startswith("mmrl_proto/v1/") and (ROOT / n).resolve() != Path(__file__).resolve()]


def headings(path: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")}


def broken_citations(text: str, root: Path = ROOT) -> list[str]:
    broken = []
    for doc, section in CITATION.findall(text):
        path = root / doc
        if not path.is_file() or section not in headings(path):
            broken.append(f'{doc}, "{section}"')
    return broken


def test_every_cited_section_exists() -> None:
    files = tracked_text_files()
    cited = {path: CITATION.findall(path.read_text(errors="replace")) for path in files}
    assert sum(map(len, cited.values())) >= 8
    broken = {str(p.relative_to(ROOT)): broken_citations(p.read_text(errors="replace")) for p in files}
    assert not {p: b for p, b in broken.items() if b}


def test_nothing_cites_a_design_document_outside_the_repository() -> None:
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in tracked_text_files()
             for m in FORBIDDEN.finditer(p.read_text(errors="replace"))]
    assert not found, found


@pytest.mark.parametrize("citation", ['docs/architecture.md, "Boundaries"', 'docs/nowhere.md, "Services"'])
def test_a_citation_of_a_missing_section_fails_the_check(citation: str) -> None:
    assert broken_citations(f"runs the loop ({citation}).") == [citation]
