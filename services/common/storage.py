"""The shared storage layout (FSx for Lustre in production, a local directory otherwise).

    <shared_root>/runs/<run_id>/adapters/v<NNNNNN>/   adapter files + manifest.json
    <shared_root>/runs/<run_id>/checkpoints/step_<NNNNNN>/

Writers publish a version by writing into a temporary sibling directory and renaming it into
place, so readers never see a half-written version. `manifest.json` lists the sha256 and size of
every other file in the directory; readers verify it before use.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
PROBE_KEY = "probe"
"""The manifest entry of an adapter's probe (services/common/adapter_probe.py)."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # a peft adapter directory, as peft and vLLM load it
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)
_MANIFEST_SHAPE = '{"files": {"<path>": {"sha256": "<hex>", ...}, ...}, ...}'
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


class ManifestError(Exception):
    """A published directory does not match its manifest (missing, altered or extra files)."""


def validate_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run_id {run_id!r} must match {_RUN_ID.pattern}")
    return run_id


# The one default of every service's shared root (MMRL_SHARED_ROOT): where `mmrl up` keeps it; containers
# and pods set /shared.
DEFAULT_SHARED_ROOT = Path(".mmrl/shared")


def run_dir(shared_root: Path, run_id: str) -> Path:
    return Path(shared_root) / "runs" / validate_run_id(run_id)


def adapters_dir(shared_root: Path, run_id: str) -> Path:
    return run_dir(shared_root, run_id) / "adapters"


def adapter_dir(shared_root: Path, run_id: str, version: int) -> Path:
    return adapters_dir(shared_root, run_id) / f"v{version:06d}"


def checkpoints_dir(shared_root: Path, run_id: str) -> Path:
    return run_dir(shared_root, run_id) / "checkpoints"


def checkpoint_dir(shared_root: Path, run_id: str, step: int) -> Path:
    return checkpoints_dir(shared_root, run_id) / f"step_{step:06d}"


def _numbered(parent: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    if not parent.is_dir():
        return []
    found = []
    for child in parent.iterdir():
        match = pattern.match(child.name)
        if match and (child / MANIFEST).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def list_adapter_versions(shared_root: Path, run_id: str) -> list[tuple[int, Path]]:
    """Complete (manifest present) adapter versions of a run, oldest first."""
    return _numbered(adapters_dir(shared_root, run_id), _VERSION_DIR)


def list_checkpoints(shared_root: Path, run_id: str) -> list[tuple[int, Path]]:
    """Complete (manifest present) checkpoints of a run, oldest first."""
    return _numbered(checkpoints_dir(shared_root, run_id), _STEP_DIR)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(directory: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(directory).as_posix()
        files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return {"created_at": time.time(), "files": files, **(extra or {})}


def verify_manifest(directory: Path) -> dict[str, Any]:
    """Checks every file against manifest.json; returns the manifest or raises ManifestError."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise ManifestError(f"{directory} has no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_text())
        listed = {rel: entry["sha256"] for rel, entry in manifest["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # bad JSON, or JSON of another shape
        raise ManifestError(f"{manifest_path} is not a valid manifest (expected {_MANIFEST_SHAPE}): "
                            f"{type(exc).__name__}: {exc}") from exc
    present = {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST
    }
    if present != set(listed):
        raise ManifestError(
            f"{directory}: files {sorted(present ^ set(listed))} differ between disk and manifest"
        )
    for rel, expected in listed.items():
        actual = sha256_file(directory / rel)
        if actual != expected:
            raise ManifestError(f"{directory / rel}: sha256 {actual} != manifest {expected}")
    return dict(manifest)


def publish_directory(
    final_dir: Path, write: Callable[[Path], None], extra_manifest: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Atomically creates `final_dir`: `write(tmp)` fills a temporary sibling, a manifest is added,
    the files are fsynced and the directory is renamed into place. Returns the manifest.

    Raises FileExistsError if `final_dir` already exists (versions are immutable).
    """
    final_dir = Path(final_dir)
    if final_dir.exists():
        raise FileExistsError(f"{final_dir} already exists")
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = final_dir.parent / f".tmp-{final_dir.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        manifest = build_manifest(tmp, extra_manifest)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        for path in tmp.rglob("*"):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        os.rename(tmp, final_dir)
        _fsync_dir(final_dir.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def publish_adapter_copy(source_dir: Path, final_dir: Path) -> Path:
    """Publishes the peft files of adapter directory `source_dir` again as the version `final_dir`
    (with a fresh manifest, which keeps the source manifest's adapter probe: the weights are the
    same); raises FileExistsError if that version exists."""

    def copy(tmp: Path) -> None:
        for name in ADAPTER_FILES:
            shutil.copy2(Path(source_dir) / name, tmp / name)

    extra = {}
    source_manifest = Path(source_dir) / MANIFEST
    if source_manifest.is_file():
        probe = json.loads(source_manifest.read_text()).get(PROBE_KEY)
        if probe is not None:
            extra[PROBE_KEY] = probe
    publish_directory(Path(final_dir), copy, extra)
    return Path(final_dir)


def adapter_rank(directory: Path) -> int:
    """The largest LoRA rank of the peft adapter in `directory` (`r` and any `rank_pattern` entry);
    ValueError saying what is wrong when its adapter_config.json cannot be read as such."""
    path = Path(directory) / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text())
        return max([int(config.get("r", 0)), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
    except (OSError, ValueError, TypeError, AttributeError) as exc:  # unreadable, not JSON, not an object, ...
        raise ValueError(f"{path} must be a readable object with an integer 'r' and a 'rank_pattern' of "
                         f"integers ({type(exc).__name__}: {exc})") from exc


VISION_MARKERS = ("visual", "vision")  # module-name parts of a VLM's vision tower and its mergers


def is_vision_module(name: str) -> bool:
    """Whether a module or weight name belongs to the vision tower or its mergers."""
    return any(marker in name for marker in VISION_MARKERS)


def adapter_vision_modules(directory: Path) -> list[str]:
    """The weights of the peft adapter in `directory` that adapt the vision tower or its mergers (vLLM
    serves them only with tower LoRA on); ValueError when its weights cannot be read."""
    from safetensors import SafetensorError, safe_open

    path = Path(directory) / ADAPTER_WEIGHTS
    try:
        with safe_open(str(path), framework="pt") as weights:
            names = list(weights.keys())
    except (OSError, SafetensorError) as exc:  # missing, or not a safetensors file
        raise ValueError(f"{path} is not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    return [name for name in names if is_vision_module(name)]


def manifest_sha256(directory: Path) -> str:
    return sha256_file(Path(directory) / MANIFEST)


def is_within(path: Path, root: Path) -> bool:
    """True when `path` resolves inside `root` (symlinks and '..' resolved)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    return True


def remove_stale_temporaries(parent: Path) -> None:
    """Deletes `.tmp-*` leftovers of writers that crashed mid-publish."""
    if Path(parent).is_dir():
        for child in Path(parent).iterdir():
            if child.name.startswith(".tmp-"):
                shutil.rmtree(child, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
