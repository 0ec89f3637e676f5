"""A real peft LoRA adapter for the tiny model, for the rollout tests and benchmark.

A few AdamW steps teach the adapter to answer a fixed action (e.g. "left") to a one-image maze
prompt, built exactly as the coordinator builds prompts (`ChatTokens.user_turn`, placeholders
expanded as the engine does). The adapter is published like the learner publishes one: written
atomically under `<shared_root>/runs/<run>/adapters/v<NNNNNN>/` with a manifest.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.common.adapter_probe import Probe, measure, probe_token_ids
from services.common.conversation import ChatTokens, expand_image_placeholders
from services.common.storage import publish_directory

PROMPT_TEXT = "Reply with one move: up, down, left, right or stop."
# peft regex: the language model's linear layers only (vLLM applies LoRA to the language model).
TARGET_MODULES = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def frame_png(seed: int, size: int = 80, cell: int = 8) -> bytes:
    """A deterministic maze-like PNG frame (blocks of `cell` px in four grey levels)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 4, (size // cell, size // cell, 1)) * 80
    pixels = blocks.repeat(cell, 0).repeat(cell, 1).repeat(3, 2).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def train_adapter(model_dir: Path, frames: Sequence[bytes], target_text: str = "left", steps: int = 25,
                  lr: float = 1e-2, rank: int = 8, seed: int = 0) -> Any:
    """A peft model whose adapter was trained to answer `target_text` after `PROMPT_TEXT` + a frame."""
    import torch
    from peft import LoraConfig, get_peft_model
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    chat = ChatTokens.from_tokenizer(tokenizer)
    images = [Image.open(io.BytesIO(data)).convert("RGB") for data in frames]
    vision = processor.image_processor(images=images, return_tensors="pt")
    merge = processor.image_processor.merge_size ** 2
    tokens_per_image = [int(t * h * w) // merge for t, h, w in vision["image_grid_thw"].tolist()]
    target = [*tokenizer.encode(target_text, add_special_tokens=False), chat.im_end]
    rows, labels = [], []
    for num_tokens in tokens_per_image:
        prompt = expand_image_placeholders(chat.user_turn(tokenizer, PROMPT_TEXT, 1), chat.image_pad, [num_tokens])
        rows.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    input_ids = torch.tensor(rows)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "mm_token_type_ids": (input_ids == chat.image_pad).long(),
        "pixel_values": vision["pixel_values"],
        "image_grid_thw": vision["image_grid_thw"],
    }
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=TARGET_MODULES)
    peft_model = get_peft_model(model, config)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        loss = peft_model(**inputs, labels=torch.tensor(labels)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return peft_model.eval()


def probe(peft_model: Any) -> Probe:
    """The adapter probe of `peft_model`, as the learner computes it for a version it publishes."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(peft_model.peft_config["default"].base_model_name_or_path)
    return measure(peft_model, probe_token_ids(tokenizer))


def publish_adapter(peft_model: Any, final_dir: Path, extra_manifest: dict[str, Any] | None = None) -> Path:
    """Writes the adapter (adapter_model.safetensors, adapter_config.json) + manifest with its probe
    atomically."""
    manifest = {**probe(peft_model).to_manifest(), **(extra_manifest or {})}
    publish_directory(Path(final_dir), lambda tmp: peft_model.save_pretrained(tmp), manifest)
    return Path(final_dir)
