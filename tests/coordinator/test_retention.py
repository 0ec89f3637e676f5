"""Retention on a real directory tree laid out as shared storage: the newest K adapters and
checkpoints stay, and so does every version in use, however old."""

from __future__ import annotations

from pathlib import Path

from services.common import storage
from services.coordinator.ops.retention import doomed, prune


def _publish(directory: Path) -> None:
    storage.publish_directory(directory, lambda tmp: (tmp / "weights.bin").write_bytes(directory.name.encode()))


def _layout(root: Path, run_id: str, versions: int, checkpoints: int) -> None:
    for version in range(1, versions + 1):
        _publish(storage.adapter_dir(root, run_id, version))
    for step in range(0, checkpoints):
        _publish(storage.checkpoint_dir(root, run_id, step))


def test_the_newest_k_stay_and_versions_in_use_are_never_deleted(tmp_path: Path) -> None:
    _layout(tmp_path, "run-a", versions=10, checkpoints=6)
    pruned = prune(tmp_path, "run-a", keep_adapters=3, keep_checkpoints=2, served_versions={2, 9},
                   current_version=5)
    assert [v for v, _ in storage.list_adapter_versions(tmp_path, "run-a")] == [2, 5, 8, 9, 10]
    assert [s for s, _ in storage.list_checkpoints(tmp_path, "run-a")] == [4, 5]
    assert pruned.adapters == [1, 3, 4, 6, 7] and pruned.checkpoints == [0, 1, 2, 3]
    for _, directory in storage.list_adapter_versions(tmp_path, "run-a"):
        storage.verify_manifest(directory)  # what stays is whole


def test_a_count_of_zero_keeps_everything_and_other_runs_are_untouched(tmp_path: Path) -> None:
    _layout(tmp_path, "run-a", versions=4, checkpoints=3)
    _layout(tmp_path, "run-b", versions=4, checkpoints=3)
    assert prune(tmp_path, "run-a", keep_adapters=0, keep_checkpoints=0, served_versions=(),
                 current_version=4).adapters == []
    prune(tmp_path, "run-a", keep_adapters=1, keep_checkpoints=1, served_versions=(), current_version=4)
    assert [v for v, _ in storage.list_adapter_versions(tmp_path, "run-a")] == [4]
    assert len(storage.list_adapter_versions(tmp_path, "run-b")) == 4
    assert len(storage.list_checkpoints(tmp_path, "run-b")) == 3


def test_in_use_wins_over_the_count() -> None:
    assert doomed(range(1, 6), 1, in_use=[1, 2, 3, 4]) == []
    assert doomed(range(1, 6), 2, in_use=[]) == [1, 2, 3]
