"""docs/configuration.md is what `mmrl config docs` generates from the settings models now: a page
left stale by a changed setting fails here (regenerate: `mmrl config docs --out docs/configuration.md`)."""

from __future__ import annotations

from pathlib import Path

from mmrl.cli.config import KINDS, SERVICES, reference_page
from mmrl.cli.config_reference import type_name, walk
from services.coordinator.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"


def test_the_committed_reference_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == reference_page(), (
        "docs/configuration.md is stale: run `mmrl config docs --out docs/configuration.md`")


def test_the_page_covers_both_config_files_and_every_service() -> None:
    page = PAGE.read_text()
    assert set(KINDS) == {"run", "sft"} and set(SERVICES) == {"coordinator", "learner", "rollout", "env", "openenv"}
    for heading in ("## Run config", "## SFT config", *(f"### `mmrl serve {s}`" for s in SERVICES)):
        assert f"\n{heading}\n" in page, heading
    for setting in walk(RunConfig):
        assert f"| `{setting.path}` |" in page or f"`{setting.path}`\n" in page, setting.path
    for variable in ("`MMRL_REDIS_URL`", "`MMRL_LEARNER_PORT`", "`MMRL_ROLLOUT_CONFIG_FILE`", "`MMRL_ENV_PORT`",
                     "`MMRL_SHARED_ROOT`", "`MMRL_COORDINATOR_PORT`"):
        assert variable in page, variable


def test_types_read_as_a_person_writes_them() -> None:
    from typing import Literal

    assert type_name(int | None) == "int | None"
    assert type_name(Literal["std", "none"]) == '"std" | "none"'
    assert type_name(dict[str, list[int]]) == "dict[str, list[int]]"
