"""Run settings that a chosen variant does not read are refused with the setting named, and settings
renamed since are refused with their new name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.coordinator.config import GrpoSettings, RunConfig


@pytest.mark.parametrize(("old", "new"), [("mazes_per_step", "tasks_per_step"), ("extra_mazes", "extra_tasks"),
                                          ("dynamic_sampling", "group_sampling")])
def test_a_renamed_setting_is_refused_with_its_new_name(old: str, new: str) -> None:
    with pytest.raises(ValidationError, match=f"grpo.{old} is now {new}"):
        RunConfig.model_validate({"model": "m", "grpo": {old: 4}})


@pytest.mark.parametrize(("settings", "named"), [
    ({"credit": "grpo", "step_advantage_weight": 0.5}, "grpo.step_advantage_weight does nothing with grpo.credit"),
    ({"group_sampling": "plain", "extra_tasks": 2}, "grpo.extra_tasks does nothing with grpo.group_sampling"),
    ({"group_sampling": "plain", "max_sampling_rounds": 2}, "grpo.max_sampling_rounds does nothing"),
])
def test_a_setting_the_chosen_variant_does_not_read_is_refused_naming_it(settings: dict[str, object],
                                                                         named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        GrpoSettings.model_validate(settings)


def test_the_variant_that_reads_a_setting_takes_it_and_defaults_pass_everywhere() -> None:
    assert GrpoSettings(credit="gigpo", step_advantage_weight=0.5).step_advantage_weight == 0.5
    assert GrpoSettings(group_sampling="dynamic", extra_tasks=2, max_sampling_rounds=2).extra_tasks == 2
    stored = GrpoSettings().model_dump()  # a stored config carries every setting at its default
    assert GrpoSettings.model_validate(stored) == GrpoSettings()
    with pytest.raises(ValidationError, match="not a registered strategy"):
        GrpoSettings(group_sampling="greedy")


def test_a_null_override_puts_a_file_setting_back_to_its_default_so_a_variant_can_be_switched() -> None:
    from pathlib import Path

    from mmrl.cli.run import load_config_dict
    from services.common.user_errors import UsageError

    shipped = Path(__file__).resolve().parents[2] / "configs" / "maze-tiny-cpu.yaml"
    with pytest.raises(UsageError, match="max_sampling_rounds does nothing"):
        load_config_dict(shipped, {"grpo.group_sampling": "plain"})
    config = load_config_dict(shipped, {"grpo.group_sampling": "plain", "grpo.max_sampling_rounds": None})
    assert config["grpo"]["max_sampling_rounds"] == GrpoSettings().max_sampling_rounds
