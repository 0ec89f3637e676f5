"""Fixed, versioned eval sets: what every environment's eval sets are made of and looked up by.

An eval set is a name, a version, a tuple of specs and the sha256 of their content (`hash_tasks`:
per spec in order, the spec as canonical JSON and the text of the task it generates). Each
environment records the hashes of its sets beside their recipes and tests that they still hold:
changing a set on purpose means a new version and a new hash, never a silent edit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from services.common.messages import shown
from services.common.task import TaskSpec


@dataclass(frozen=True)
class EvalSet:
    name: str
    version: str
    content_hash: str
    specs: tuple[TaskSpec, ...]


def hash_tasks(specs: Sequence[TaskSpec], task_text: Callable[[TaskSpec], str]) -> str:
    """sha256 over every spec (canonical JSON) and the text of its generated task (`task_text`)."""
    digest = hashlib.sha256()
    for spec in specs:
        record = {"seed": spec.seed, "max_moves": spec.max_moves, "options": dict(sorted(spec.options.items()))}
        digest.update(json.dumps(record, sort_keys=True).encode())
        digest.update(b"\n")
        digest.update(task_text(spec).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def recipe_named(recipes: Mapping[str, object], default: str, name: str) -> str:
    """The name of the set asked for ("" = `default`); KeyError naming the known sets for another."""
    name = name or default
    if name not in recipes:
        raise KeyError(f"unknown eval set {shown(name)} (known: {', '.join(sorted(recipes))})")
    return name
