"""The production path (Qwen3-VL-8B, GPU) up to the point where weights would load: configs agree
across services, and LoRA targets resolve on an 8B-shaped model built on the meta device."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.training import TrainSettings
from services.coordinator.config import load_run_config
from services.rollout.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "configs" / "qwen3-vl-8b-hyperpod.yaml"


def _qwen3_vl_8b_dir(tmp_path: Path) -> Path:
    """config.json of the published Qwen3-VL-8B-Instruct shape (no weights)."""
    from transformers import Qwen3VLConfig

    config = Qwen3VLConfig(
        text_config={"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
                     "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 128, "max_position_embeddings": 262144,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0,
                                         "mrope_section": [24, 20, 20], "mrope_interleaved": True}},
        vision_config={"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                       "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "out_hidden_size": 4096, "num_position_embeddings": 2304,
                       "deepstack_visual_indexes": [8, 16, 24]},
    )
    config.save_pretrained(tmp_path)
    return tmp_path


def test_the_production_run_config_is_accepted_by_the_learner_and_fits_the_rollout_engine() -> None:
    run = load_run_config(RUN)
    learner = TrainSettings.from_json(run.train_settings().model_dump_json())
    rollout = RolloutConfig(model=run.model)
    assert learner.lora.rank == run.lora.rank <= rollout.max_lora_rank
    assert rollout.resolved_dtype(on_cpu=False) == "bfloat16"
    assert run.colocated and rollout.resolved_memory_utilization(on_cpu=False) < 0.5


def test_lora_targets_resolve_to_the_language_model_of_an_8b_shaped_qwen3_vl(tmp_path: Path) -> None:
    from services.common.training import DEFAULT_LORA_TARGETS
    from services.learner.policy import lora_targets, model_module_kinds

    names = model_module_kinds(_qwen3_vl_8b_dir(tmp_path))  # meta device: no memory, no weights
    targets = lora_targets(names, DEFAULT_LORA_TARGETS)
    assert len(targets) == 36 * 7  # q, k, v, o, gate, up, down in each of the 36 decoder layers
    assert not [t for t in targets if "visual" in t]
    assert any("visual" in n for n in names)


def test_lora_targets_may_reach_the_vision_towers_linear_layers_but_not_its_patch_embedding(tmp_path: Path) -> None:
    from services.common.training import DEFAULT_LORA_TARGETS, TOWER_LORA_TARGETS
    from services.learner.policy import adapts_vision, lora_targets, model_module_kinds

    modules = model_module_kinds(_qwen3_vl_8b_dir(tmp_path))
    tower = TOWER_LORA_TARGETS
    vision = [name for name, kind in modules.items() if kind == "Linear" and "visual" in name]
    assert sorted(lora_targets(modules, tower)) == sorted([*lora_targets(modules, DEFAULT_LORA_TARGETS), *vision])
    assert adapts_vision(modules, tower) and not adapts_vision(modules, DEFAULT_LORA_TARGETS)
    with pytest.raises(ValueError, match=r"selects 'model\.visual\.patch_embed\.proj', a Conv3d"):
        lora_targets(modules, r".*visual\..*\.proj")
