"""Command lines the docs show, read from their Markdown: `mmrl ...` lines of code blocks, expanded
from their synopsis notation into argument lists, and `make TARGET` in code."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*```")
MMRL = re.compile(r"(?:^|[\s/(`$=])mmrl\s+(.*)$")
# Synopsis words and the example value each stands for when the line is parsed.
PLACEHOLDERS = {
    "DIR": "/tmp/mmrl-docs", "FILE": "configs/maze-tiny-cpu.yaml", "N": "2", "K": "2", "T": "1", "M": "64",
    "R": "0", "D": "float32", "ADDR": "127.0.0.1:50051", "HOST:PORT": "127.0.0.1:29400", "RUN_ID": "run-0",
    "KEY=VALUE": "steps=2", "COMMAND": "run",
}


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str  # as the doc writes it, after `mmrl`

    def variants(self) -> list[list[str]]:
        """Argument lists: [X] kept without its brackets, {a,b} and a|b each alternative."""
        words = self.text.replace("[", " ").replace("]", " ").split()
        choices = []
        for word in words:
            if re.fullmatch(r"\{[^{}]+\}", word):
                choices.append(word[1:-1].split(","))
            elif "|" in word and not word.startswith("-"):
                choices.append(word.split("|"))
            else:
                choices.append([PLACEHOLDERS.get(word, word)])
        return [list(v) for v in itertools.product(*choices)]


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, continuation lines joined."""
    out: list[tuple[int, str]] = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            continue
        if out and (out[-1][1].endswith("\\") or (line.startswith(" ") and line.strip().startswith(("[", "--")))):
            out[-1] = (out[-1][0], out[-1][1].rstrip("\\").rstrip() + " " + line.strip())
        else:
            out.append((number, line))
    return out


def mmrl_commands(path: Path, text: str | None = None) -> list[DocCommand]:
    commands = []
    for number, line in code_lines(path.read_text() if text is None else text):
        line = re.sub(r"\s+#.*$", "", line)  # a shell comment
        match = MMRL.search(line)
        if match and not line.lstrip().startswith(("docker", "kubectl")):
            rest = re.sub(r"\)\s*$", "", match.group(1)).strip()  # "(= mmrl bench gpu)"
            commands.append(DocCommand(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}",
                                       rest))
    return commands


def make_targets_named(text: str) -> set[str]:
    """`make X` in code blocks and inline code spans."""
    code = [line for _, line in code_lines(text)] + re.findall(r"`([^`\n]+)`", text)
    return {m for chunk in code for m in re.findall(r"(?:^|[\s;&|(])make\s+([a-z][\w-]*)", chunk)}


def makefile_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*)\s*:(?!=)", makefile.read_text(), re.MULTILINE))
