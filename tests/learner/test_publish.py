"""Published adapters: peft format (loads in peft with the learner's log-probs), language model
only, atomic (a crash mid-write leaves no readable version)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from services.common import storage
from services.common.trajectory import Trajectory
from services.learner import publish
from services.learner.batch import collate, prepare_batch
from services.learner.policy import load_base_model, token_logprobs
from tests.learner.settings import train_json

CONFIG = train_json(learning_rate=0.05, micro_batch_size=6, lora_rank=8, lora_alpha=16)


def _trained(make_driver: Callable[..., Any], trajectories: list[Trajectory]) -> Any:
    driver = make_driver()
    driver.configure("run", CONFIG)
    for _ in range(2):
        driver.train_step("run", trajectories)
    return driver


def test_a_published_adapter_loads_in_peft_and_gives_the_learners_logprobs(
    make_driver: Callable[..., Any], trajectories: list[Trajectory], tiny_model_dir: Path
) -> None:
    from peft import PeftModel

    driver = _trained(make_driver, trajectories)
    published = driver.publish("run")
    engine = driver.engine
    batch = collate(
        prepare_batch(trajectories, engine.spec, engine.frames),
        engine.spec.pad_token_id,
        engine.spec.image_token_id,
    )
    with torch.no_grad():
        learner, _ = token_logprobs(engine.run.model, batch, "cpu")
        loaded = PeftModel.from_pretrained(load_base_model(tiny_model_dir), published.path)
        from_peft, _ = token_logprobs(loaded, batch, "cpu")
        with loaded.disable_adapter():
            base, _ = token_logprobs(loaded, batch, "cpu")
    mask = batch.loss_mask.bool()
    assert (learner - from_peft)[mask].abs().max().item() < 1e-6
    assert (learner - base)[mask].abs().max().item() > 1e-3  # the adapter really changes the policy


def test_a_published_adapter_holds_only_language_model_lora_weights_in_peft_format(
    make_driver: Callable[..., Any], trajectories: list[Trajectory]
) -> None:
    driver = _trained(make_driver, trajectories[:2])
    path = driver.publish("run").path
    tensors = load_file(str(path / publish.ADAPTER_WEIGHTS))
    layers = {".".join(k.split(".")[-4:-2]) for k in tensors}
    assert layers == {
        f"{kind}.{proj}"
        for kind, projs in (("self_attn", "qkvo"), ("mlp", ("gate", "up", "down")))
        for proj in (f"{p}_proj" for p in projs)
    }
    assert all(k.startswith("base_model.model.model.language_model.layers.") for k in tensors)
    assert all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in tensors)
    config = json.loads((path / publish.ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16, "LORA")
    assert config["inference_mode"] is True


def test_a_crash_mid_publish_leaves_no_readable_version_and_the_next_publish_takes_its_place(
    make_driver: Callable[..., Any], trajectories: list[Trajectory], monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = _trained(make_driver, trajectories[:2])
    shared = driver.shared_root
    real_save = publish.save_file

    def save_then_crash(tensors: dict[str, torch.Tensor], filename: str, metadata: Any = None) -> None:
        real_save(tensors, filename, metadata=metadata)
        raise OSError("disk vanished mid-write")

    monkeypatch.setattr(publish, "save_file", save_then_crash)
    with pytest.raises(OSError, match="mid-write"):
        driver.publish("run")
    assert storage.list_adapter_versions(shared, "run") == []
    assert not storage.adapter_dir(shared, "run", 1).exists()
    # A writer killed outright leaves a temporary directory: never listed, removed on restart.
    leftover = storage.adapters_dir(shared, "run") / ".tmp-v000001-deadbeef"
    leftover.mkdir(parents=True)
    (leftover / publish.ADAPTER_WEIGHTS).write_bytes(b"half")
    assert storage.list_adapter_versions(shared, "run") == []

    monkeypatch.setattr(publish, "save_file", real_save)
    assert driver.publish("run").version == 1
    assert [v for v, _ in storage.list_adapter_versions(shared, "run")] == [1]
    make_driver().configure("run", CONFIG)  # a restarted learner cleans up
    assert not leftover.exists()
