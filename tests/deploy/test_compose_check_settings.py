"""scripts/compose-check.sh starts its runs with the shipped maze config and `--set` overrides: each
set of overrides must still be a valid run config (a renamed setting fails the check only after the
images are built and the stack is up, twenty minutes in)."""

from __future__ import annotations

import re

import pytest
from deploy_contract import REPO_ROOT

from services.common.config_files import parse_overrides
from services.coordinator.config import load_run_config

SCRIPT = (REPO_ROOT / "scripts" / "compose-check.sh").read_text()
ARRAYS = dict(re.findall(r"^(\w+_SETTINGS)=\((.*?)\)", SCRIPT, flags=re.M | re.S))


def test_the_script_names_its_config_and_two_sets_of_overrides() -> None:
    assert set(ARRAYS) == {"RUN_SETTINGS", "TRACE_SETTINGS"}
    assert "--config /configs/maze-tiny-cpu.yaml" in SCRIPT


@pytest.mark.parametrize("name", ["RUN_SETTINGS", "TRACE_SETTINGS"])
def test_every_override_of_the_script_makes_a_valid_run_config(name: str) -> None:
    pairs = re.findall(r"--set (\S+)", ARRAYS[name])
    assert pairs, name
    overrides = parse_overrides(pairs)
    config = load_run_config(REPO_ROOT / "configs" / "maze-tiny-cpu.yaml", overrides)
    dumped = config.model_dump()
    for key, value in overrides.items():
        node = dumped
        for part in key.split("."):
            node = node[part]
        assert node == value, key


def test_a_renamed_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="mazes_per_step is now tasks_per_step"):
        load_run_config(REPO_ROOT / "configs" / "maze-tiny-cpu.yaml", {"grpo.mazes_per_step": 4})
