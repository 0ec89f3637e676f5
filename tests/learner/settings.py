"""Training settings for learner tests, written as flat keyword arguments."""

from __future__ import annotations

import json
from typing import Any

from services.common.training import LoraSettings, LossSettings, TrainSettings

_RENAMED = {"num_epochs": "epochs"}


def train_json(**flat: Any) -> str:
    """ConfigureRun's config_json from flat names: `lora_rank` -> lora.rank, loss and top-level
    fields by their own names, everything else an optimiser setting (`num_epochs` -> optim.epochs)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        if key.startswith("lora_"):
            section, name = "lora", key.removeprefix("lora_")
            assert name in LoraSettings.model_fields, key
        elif key in LossSettings.model_fields:
            section, name = "loss", key
        elif key in ("seed", "total_steps", "action_sequences"):
            nested[key] = value
            continue
        else:
            section, name = "optim", _RENAMED.get(key, key)
        nested.setdefault(section, {})[name] = value
    text = json.dumps(nested)
    TrainSettings.from_json(text)  # a typo in a test fails here, not as a learner error
    return text
