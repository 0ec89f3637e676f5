"""The sharded build: a meta skeleton, the adapter made as over a loaded model, and each rank's rows
read from the safetensors files (one rank here; tests/learner/test_distributed.py runs two)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from services.common.training import TrainSettings
from services.learner.distributed import init_distributed
from services.learner.policy import add_lora, load_base_model
from services.learner.weights import SafetensorsReader, build_policy, checkpoint_key


def test_the_reader_returns_the_rows_safetensors_holds(tiny_model_dir: Path) -> None:
    reader = SafetensorsReader(tiny_model_dir)
    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as handle:
        for key in list(handle.keys())[:20]:
            full = handle.get_tensor(key)
            assert torch.equal(reader.rows(key, 0, full.shape[0]), full)
            if full.shape[0] > 3:
                assert torch.equal(reader.rows(key, 1, 2), full[1:3])


def test_a_directory_without_safetensors_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no model.safetensors"):
        SafetensorsReader(tmp_path)


def test_peft_parameter_names_map_to_checkpoint_keys() -> None:
    name = "base_model.model.model.language_model.layers.0.self_attn.q_proj.base_layer.weight"
    assert checkpoint_key(name) == "model.language_model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize("replicate_base", [False, True])
def test_the_sharded_build_holds_the_checkpoint_in_bfloat16_and_the_adapter_of_the_unsharded_path(
    tiny_model_dir: Path, replicate_base: bool
) -> None:
    torch.set_num_threads(1)
    config = TrainSettings(seed=3)
    reference = dict(add_lora(load_base_model(tiny_model_dir), config).named_parameters())
    model = build_policy(tiny_model_dir, config, init_distributed("cpu"), torch.bfloat16, replicate_base)
    names = [name for name, _ in model.named_parameters()]
    assert names == list(reference)
    for name, param in model.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param.detach()
        if param.requires_grad:  # the adapter: float32, the same random draws
            assert full.dtype == torch.float32 and torch.equal(full, reference[name]), name
        else:  # the frozen base: the checkpoint's values in the compute dtype
            assert full.dtype == torch.bfloat16 and torch.equal(full, reference[name].to(torch.bfloat16)), name
        assert not hasattr(param, "full_tensor") or not replicate_base or param.requires_grad, name
    assert any(p.requires_grad and p.abs().sum() > 0 for p in reference.values())  # lora_A is random
