"""Retention of a run's adapters and checkpoints on shared storage.

After each checkpoint the run keeps the newest `keep_adapters` adapter versions and the newest
`keep_checkpoints` checkpoints, plus, whatever their age, every adapter version a rollout replica
still serves (ListAdapters: vLLM may reload a served adapter from its path at any time) and the
version the run samples with. The newest checkpoint, the one a resume loads, is always kept (a
count is at least 1). A count of 0 keeps everything (the local default); the HyperPod overlay sets
both. RunManager.maintain prunes the runs it drives.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from services.common import storage

log = logging.getLogger("mmrl.coordinator.retention")


@dataclass(frozen=True)
class Pruned:
    adapters: list[int]
    checkpoints: list[int]


def doomed(numbered: Iterable[int], keep_newest: int, in_use: Iterable[int]) -> list[int]:
    """The numbers to delete: all but the newest `keep_newest` and those in use (0 keeps all)."""
    ordered = sorted(set(numbered))
    if keep_newest <= 0:
        return []
    kept = set(ordered[-keep_newest:]) | set(in_use)
    return [n for n in ordered if n not in kept]


def prune(shared_root: Path, run_id: str, *, keep_adapters: int, keep_checkpoints: int,
          served_versions: Iterable[int], current_version: int) -> Pruned:
    """Deletes the run's adapters and checkpoints outside the retention (see the module docstring)."""
    adapters = dict(storage.list_adapter_versions(shared_root, run_id))
    checkpoints = dict(storage.list_checkpoints(shared_root, run_id))
    gone_adapters = doomed(adapters, keep_adapters, [*served_versions, current_version])
    gone_checkpoints = doomed(checkpoints, keep_checkpoints, [])
    for version in gone_adapters:
        shutil.rmtree(adapters[version], ignore_errors=True)
    for step in gone_checkpoints:
        shutil.rmtree(checkpoints[step], ignore_errors=True)
    if gone_adapters or gone_checkpoints:
        log.info("pruned", extra={"run_id": run_id, "adapters": gone_adapters, "checkpoints": gone_checkpoints})
    return Pruned(adapters=gone_adapters, checkpoints=gone_checkpoints)
