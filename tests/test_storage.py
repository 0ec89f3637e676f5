from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common import storage


def _write_two_files(directory: Path) -> None:
    (directory / "a.bin").write_bytes(b"alpha")
    (directory / "b.json").write_text("{}")


def test_publish_writes_a_manifest_that_verifies(tmp_path: Path) -> None:
    target = storage.adapter_dir(tmp_path, "run-1", 3)
    manifest = storage.publish_directory(target, _write_two_files, {"version": 3})
    assert target.name == "v000003"
    assert set(manifest["files"]) == {"a.bin", "b.json"}
    assert storage.verify_manifest(target)["version"] == 3
    assert storage.list_adapter_versions(tmp_path, "run-1") == [(3, target)]


def test_tampered_file_fails_verification(tmp_path: Path) -> None:
    target = storage.adapter_dir(tmp_path, "run-1", 1)
    storage.publish_directory(target, _write_two_files)
    (target / "a.bin").write_bytes(b"ALPHA")
    with pytest.raises(storage.ManifestError, match="sha256"):
        storage.verify_manifest(target)


def test_extra_file_fails_verification(tmp_path: Path) -> None:
    target = storage.adapter_dir(tmp_path, "run-1", 1)
    storage.publish_directory(target, _write_two_files)
    (target / "extra").write_text("x")
    with pytest.raises(storage.ManifestError, match="differ"):
        storage.verify_manifest(target)


def test_a_crash_mid_write_leaves_no_readable_version(tmp_path: Path) -> None:
    target = storage.adapter_dir(tmp_path, "run-1", 2)

    def crash(directory: Path) -> None:
        (directory / "half").write_bytes(b"x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        storage.publish_directory(target, crash)
    assert not target.exists()
    assert storage.list_adapter_versions(tmp_path, "run-1") == []
    assert not list(target.parent.glob(".tmp-*"))


def test_versions_are_immutable(tmp_path: Path) -> None:
    target = storage.checkpoint_dir(tmp_path, "r", 5)
    storage.publish_directory(target, _write_two_files)
    with pytest.raises(FileExistsError):
        storage.publish_directory(target, _write_two_files)


def test_an_adapter_copy_is_a_new_version_of_the_peft_files_only(tmp_path: Path) -> None:
    source = tmp_path / "trained"
    source.mkdir()
    (source / storage.ADAPTER_WEIGHTS).write_bytes(b"weights")
    (source / storage.ADAPTER_CONFIG).write_text('{"r": 16}')
    (source / "README.md").write_text("not part of the adapter")
    target = storage.publish_adapter_copy(source, storage.adapter_dir(tmp_path, "run-1", 2))
    assert set(storage.verify_manifest(target)["files"]) == set(storage.ADAPTER_FILES)
    assert (target / storage.ADAPTER_WEIGHTS).read_bytes() == b"weights"
    with pytest.raises(FileExistsError):
        storage.publish_adapter_copy(source, target)


def test_directory_without_manifest_is_not_listed(tmp_path: Path) -> None:
    half = storage.adapter_dir(tmp_path, "r", 7)
    half.mkdir(parents=True)
    (half / "adapter_model.safetensors").write_bytes(b"x")
    assert storage.list_adapter_versions(tmp_path, "r") == []
    assert json.dumps(storage.list_checkpoints(tmp_path, "r")) == "[]"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "-lead", "x" * 200])
def test_bad_run_ids_are_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run_id"):
        storage.run_dir(tmp_path, bad)


def test_is_within_resolves_dot_dot(tmp_path: Path) -> None:
    assert storage.is_within(tmp_path / "runs" / "a", tmp_path)
    assert not storage.is_within(tmp_path / "runs" / ".." / ".." / "etc", tmp_path)


@pytest.mark.parametrize("manifest", [
    "not json", "[1, 2]", '"files"', '{"created_at": 1}', '{"files": ["a.bin", "b.json"]}',
    '{"files": {"a.bin": {"bytes": 5}, "b.json": {"bytes": 2}}}', '{"files": {"a.bin": "x", "b.json": "y"}}',
])
def test_a_malformed_manifest_is_a_manifest_error(tmp_path: Path, manifest: str) -> None:
    target = storage.adapter_dir(tmp_path, "run-1", 1)
    storage.publish_directory(target, _write_two_files)
    (target / storage.MANIFEST).write_text(manifest)
    with pytest.raises(storage.ManifestError, match="is not a valid manifest"):
        storage.verify_manifest(target)
