"""A run's files on shared storage: the frames of its episodes and its adapter versions.

Every file served is found through what the coordinator recorded (an episode record's frame list,
the adapters directory) and must resolve inside `<shared_root>/runs/<run_id>/`; anything else is
a 404, whatever the ids in the URL or the paths in the record say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from services.common import storage
from services.coordinator.api.deps import RunDep, SettingsDep, StoreDep
from services.coordinator.grpo.records import frame_file

router = APIRouter(prefix="/v1/runs", tags=["runs"])


class AdapterVersion(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(..., description="The adapter version (the learner's publish count).")
    created_at: float | None = Field(None, description="When it was published (Unix seconds), from its manifest.")
    bytes: int = Field(..., description="Bytes of its files, as its manifest lists them.")
    path: str = Field(..., description="Its directory relative to the run's directory on shared storage.")


class AdapterList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapters: list[AdapterVersion] = Field(..., description="Complete adapter versions, oldest first.")


@router.get("/{run_id}/episodes/{episode_id}/frames/{index}", response_class=FileResponse,
            responses={200: {"content": {"image/png": {}}, "description": "The frame as PNG."}})
async def episode_frame(episode_id: str, index: int, run: RunDep, store: StoreDep,
                        settings: SettingsDep) -> FileResponse:
    """Frame `index` of an episode (0: what the agent saw before its first action; the last: where
    it ended), as the run wrote it to shared storage."""
    record = await store.episode(run["id"], episode_id)
    path = frame_file(settings.shared_root, run["id"], record, index) if record is not None else None
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"no frame {index} of episode {episode_id!r} in run {run['id']!r}")
    return FileResponse(path, media_type="image/png", headers={"Cache-Control": "private, max-age=60"})


@router.get("/{run_id}/adapters", response_model=AdapterList)
async def run_adapters(run: RunDep, settings: SettingsDep) -> AdapterList:
    """The adapter versions the run has published to shared storage."""
    root = storage.run_dir(settings.shared_root, run["id"])
    adapters = []
    for version, directory in storage.list_adapter_versions(settings.shared_root, run["id"]):
        manifest = _manifest(directory)
        files = manifest.get("files")
        listed = [f for f in files.values() if isinstance(f, dict)] if isinstance(files, dict) else []
        adapters.append(AdapterVersion(
            version=version, created_at=manifest.get("created_at"),
            bytes=sum(int(f.get("bytes", 0)) for f in listed),
            path=directory.relative_to(root).as_posix()))
    return AdapterList(adapters=adapters)


def _manifest(directory: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((directory / storage.MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}
