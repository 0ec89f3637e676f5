"""LoRA adapters on disk in the peft format that peft and vLLM load: `adapter_model.safetensors`
(keys like `base_model.model.<module>.lora_A.weight`) and `adapter_config.json`.

`publish_adapter` writes version N under `<shared_root>/runs/<run>/adapters/v<N>/` through
`storage.publish_directory` (temporary directory, manifest with the sha256 of every file, fsync,
rename): a crash mid-write never leaves a readable half-version.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from services.common import storage
from services.common.storage import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from services.learner.policy import ADAPTER_NAME


def peft_key(name: str) -> str:
    """A trainable parameter's module path -> its key in a saved adapter (peft drops the adapter
    name: `...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`)."""
    return name.replace(f".{ADAPTER_NAME}.", ".")


def write_adapter(directory: Path, state: dict[str, torch.Tensor], peft_config: Any) -> None:
    """Writes trainable parameters `state` (module-path keys, full tensors) as a peft adapter."""
    tensors = {peft_key(k): v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}
    assert all("lora_" in k for k in tensors), "only LoRA weights belong in an adapter"
    save_file(tensors, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = peft_config.to_dict()
    config["inference_mode"] = True
    for key, value in config.items():  # sets (e.g. target_modules as a list) are not JSON
        if isinstance(value, set):
            config[key] = sorted(value)
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))


def read_adapter(directory: Path, expected_shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Reads an adapter back into module-path keys; ValueError unless its tensors are exactly the
    model's trainable ones (`expected_shapes`: module path -> full shape)."""
    tensors = load_file(str(directory / ADAPTER_WEIGHTS))
    by_key = {peft_key(name): name for name in expected_shapes}
    if set(tensors) != set(by_key):
        missing, extra = sorted(set(by_key) - set(tensors)), sorted(set(tensors) - set(by_key))
        raise ValueError(
            f"adapter in {directory} does not match the model's LoRA layers "
            f"(missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
            f"unexpected {extra[:3]}{'...' if len(extra) > 3 else ''})"
        )
    for key, tensor in tensors.items():
        if tensor.shape != expected_shapes[by_key[key]]:
            raise ValueError(
                f"adapter in {directory}: {key} has shape {tuple(tensor.shape)}, "
                f"the model needs {tuple(expected_shapes[by_key[key]])} (a different LoRA rank?)"
            )
    return {by_key[k]: v for k, v in tensors.items()}


@dataclass(frozen=True)
class PublishedAdapter:
    version: int
    path: Path
    manifest_sha256: str
    publish_ms: float


def next_adapter_version(shared_root: Path, run_id: str, current: int) -> int:
    """One past the newest version known here or on disk (versions are never reused)."""
    on_disk = [v for v, _ in storage.list_adapter_versions(shared_root, run_id)]
    return max([current, *on_disk]) + 1


def publish_adapter(
    shared_root: Path,
    run_id: str,
    version: int,
    state: dict[str, torch.Tensor],
    peft_config: Any,
    extra_manifest: dict[str, Any] | None = None,
) -> PublishedAdapter:
    """Atomically writes adapter version `version` of run `run_id`; returns where and its manifest."""
    start = time.perf_counter()
    final = storage.adapter_dir(shared_root, run_id, version)
    storage.publish_directory(
        final,
        lambda tmp: write_adapter(tmp, state, peft_config),
        extra_manifest={"run_id": run_id, "version": version, **(extra_manifest or {})},
    )
    return PublishedAdapter(
        version=version,
        path=final,
        manifest_sha256=storage.manifest_sha256(final),
        publish_ms=(time.perf_counter() - start) * 1000.0,
    )
