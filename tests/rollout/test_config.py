"""The rollout service's configuration: typed, bounded, unknown keys refused, deployment settings from env."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mmrl.cli import main as cli
from services.rollout.config import RolloutConfig, ServerSettings, load_config, lora_slot_rank


def test_unknown_keys_and_a_retention_window_below_two_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        RolloutConfig(model="m", max_lora=3)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="adapter_retention"):
        RolloutConfig(model="m", adapter_retention=1)
    with pytest.raises(ValidationError, match="max_lora_rank"):
        RolloutConfig(model="m", max_lora_rank=12)  # type: ignore[arg-type]


def test_platform_dependent_defaults_resolve_for_cpu_and_gpu() -> None:
    config = RolloutConfig(model="m")
    assert (config.resolved_dtype(on_cpu=True), config.resolved_memory_utilization(on_cpu=True)) == ("float32", 0.1)
    assert config.resolved_dtype(on_cpu=False) == "bfloat16"
    assert RolloutConfig(model="m", dtype="float16").resolved_dtype(on_cpu=True) == "float16"
    assert config.batched_tokens == 8192 and not config.chunked_prefill
    assert (config.resolved_block_size(on_cpu=True), config.resolved_block_size(on_cpu=False)) == (32, None)
    assert RolloutConfig(model="m", block_size=64).resolved_block_size(on_cpu=True) == 64


def test_a_config_file_is_read_and_command_line_values_override_it(tmp_path: Path) -> None:
    path = tmp_path / "rollout.yaml"
    path.write_text("model: /models/a\nmax_model_len: 1024\nadapter_retention: 3\n")
    config = load_config(path, {"model": "/models/b", "max_model_len": None})
    assert (config.model, config.max_model_len, config.adapter_retention) == ("/models/b", 1024, 3)
    toml = tmp_path / "rollout.toml"
    toml.write_text('model = "/models/c"\nlora_kernels = "vllm"\n')
    assert load_config(toml).lora_kernels == "vllm"


def test_an_adapter_rank_maps_to_the_smallest_slot_size_that_holds_it() -> None:
    assert [lora_slot_rank(r) for r in (1, 8, 16, 17, 64, 100)] == [1, 8, 16, 32, 64, 128]
    for rank in (0, 513):
        with pytest.raises(ValueError, match="LoRA rank"):
            lora_slot_rank(rank)


def test_an_unsupported_max_lora_rank_on_the_command_line_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "rollout", "--model", "m", "--port", "0", "--max-lora-rank", "12"]) == 2
    assert capsys.readouterr().err == ("mmrl serve rollout: max_lora_rank: Input should be 1, 8, 16, 32, 64, 128, "
                                       "256, 320 or 512 (got '12')\n")


def test_deployment_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MMRL_SHARED_ROOT", str(tmp_path))
    monkeypatch.setenv("MMRL_ROLLOUT_PORT", "6000")
    monkeypatch.setenv("MMRL_ROLLOUT_ADDRS", "rollout:50052")  # the coordinator's variable is ignored here
    settings = ServerSettings()
    assert (settings.shared_root, settings.port) == (tmp_path, 6000)


def test_serving_without_a_model_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("MMRL_ROLLOUT_MODEL", raising=False)
    assert cli.main(["serve", "rollout", "--port", "0"]) == 2
    assert capsys.readouterr().err == "mmrl serve rollout: model: required, not given\n"


def test_parallel_sizes_reach_the_engine_on_gpu_and_are_refused_on_the_cpu_backend() -> None:
    from services.rollout import engine_vllm

    config = RolloutConfig(model="stub", tensor_parallel_size=2, data_parallel_size=4)
    config.check_backend(on_cpu=False)
    assert config.gpus_per_service == 8
    with pytest.raises(ValueError, match="CPU backend runs one engine.*set both to 1"):
        engine_vllm.engine_args(config)  # the CPU backend here
    args = engine_vllm.engine_args(RolloutConfig(model="stub"))
    assert (args.tensor_parallel_size, args.data_parallel_size) == (1, 1)
    with pytest.raises(ValueError):
        RolloutConfig(model="stub", tensor_parallel_size=0)
