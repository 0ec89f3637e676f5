"""A trained policy as a standalone Hugging Face model: the LoRA adapter merged into its base.

`merge_adapter` loads the base in float32, applies the adapter with peft, folds it into the base
weights (`merge_and_unload`: W + (alpha / r) B A) and saves the result in the base checkpoint's
dtype, with the base's processor, tokenizer, chat template and generation config, so stock vLLM
and transformers load it like any checkpoint of that architecture. The directory is written
under a temporary name and renamed: a half-written export is never found at `out`.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from services.common import storage
from services.common.storage import ADAPTER_CONFIG, ADAPTER_WEIGHTS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EXPORT_RECORD = "mmrl_export.json"
# Files of the base directory that describe the model's inputs and outputs rather than its weights.
_CARRIED_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
_NOT_CARRIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json", "mmrl_model.json"}


def base_model_of(adapter_dir: Path) -> Path:
    """The base model an adapter was trained on: the learner's manifest (published versions), the
    checkpoint's trainer state, or peft's `base_model_name_or_path`. ValueError when none names a
    local model directory."""
    adapter_dir = Path(adapter_dir)
    candidates: list[str] = []
    for record, key in (("manifest.json", "base_model"), ("trainer_state.json", "base_model"),
                        (ADAPTER_CONFIG, "base_model_name_or_path")):
        path = adapter_dir / record
        if path.is_file():
            value = json.loads(path.read_text()).get(key)
            if value:
                candidates.append(str(value))
    for candidate in candidates:
        if (Path(candidate) / "config.json").is_file():
            return Path(candidate)
    named = f" (it names {candidates[0]!r}, not a local model directory)" if candidates else ""
    raise ValueError(f"cannot tell the base model of {adapter_dir}{named}: pass --base-model DIR")


def _check_adapter(adapter_dir: Path) -> None:
    if not (adapter_dir / ADAPTER_WEIGHTS).is_file() or not (adapter_dir / ADAPTER_CONFIG).is_file():
        raise ValueError(f"{adapter_dir} is not a LoRA adapter ({ADAPTER_WEIGHTS} and {ADAPTER_CONFIG} needed)")
    if (adapter_dir / storage.MANIFEST).is_file():
        try:
            storage.verify_manifest(adapter_dir)
        except storage.ManifestError as exc:
            raise ValueError(f"{adapter_dir} fails its manifest: {exc}") from exc


def saved_dtype(base_model: Path) -> torch.dtype:
    """The dtype the base checkpoint's config records (float32 when it records none)."""
    config = json.loads((Path(base_model) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    return DTYPES.get(str(name), torch.float32)


def merged_model(adapter_dir: Path, base_model: Path) -> Any:
    """The base with the adapter folded in (float32, in memory)."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    base = AutoModelForImageTextToText.from_pretrained(base_model, dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def merge_adapter(
    adapter_dir: Path, out: Path, base_model: Path | None = None, dtype: str = "auto", force: bool = False
) -> Path:
    """Writes the merged model to `out` (see the module docstring); returns `out`. ValueError for an
    adapter that is not one, an unknown base, or an `out` that exists (unless `force`)."""
    from transformers import AutoProcessor

    adapter_dir, out = Path(adapter_dir), Path(out)
    _check_adapter(adapter_dir)
    base = Path(base_model) if base_model is not None else base_model_of(adapter_dir)
    if not (base / "config.json").is_file():
        raise ValueError(f"base model {base} is not a local model directory (no config.json)")
    if out.exists() and not force:
        raise ValueError(f"{out} exists (use --force to replace it)")
    target_dtype = saved_dtype(base) if dtype == "auto" else DTYPES[dtype]
    model = merged_model(adapter_dir, base).to(target_dtype)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        AutoProcessor.from_pretrained(base).save_pretrained(tmp)
        for path in base.iterdir():
            if path.is_file() and path.suffix in _CARRIED_SUFFIXES and path.name not in _NOT_CARRIED \
                    and not (tmp / path.name).exists():
                shutil.copy2(path, tmp / path.name)
        record = {"base_model": str(base.resolve()), "adapter": str(adapter_dir.resolve()),
                  "dtype": str(target_dtype).removeprefix("torch.")}
        if (adapter_dir / storage.MANIFEST).is_file():
            record["adapter_manifest_sha256"] = storage.manifest_sha256(adapter_dir)
        (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out
