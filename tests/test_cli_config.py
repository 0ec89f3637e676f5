"""`mmrl config show` prints a config with every setting's documentation and default, as YAML that
loads back to the same config; `mmrl config validate` says ok or gives one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mmrl.cli import main as cli
from services.common.config_files import load_model_file
from services.coordinator.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
RUN_CONFIGS = ["frozenlake-4x4-tiny-cpu.yaml", "maze-tiny-cpu.yaml", "minigrid-empty-6x6-tiny-cpu.yaml",
               "qwen3-vl-8b-hyperpod.yaml", "sokoban-tiny-cpu.yaml"]
SFT_CONFIGS = ["sft-maze-tiny.yaml", "sft-sokoban-tiny.yaml"]


def _mmrl(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_every_shipped_config_is_covered() -> None:
    assert sorted(RUN_CONFIGS + SFT_CONFIGS) == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("name", RUN_CONFIGS)
def test_show_prints_a_run_config_documented_and_it_loads_back_unchanged(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "configs" / name
    status, out, err = _mmrl(["config", "show", str(path)], capsys)
    assert status == 0 and not err
    assert yaml.safe_load(out) == load_model_file(RunConfig, path).model_dump(mode="json")
    assert "# G: episodes per task, all on the same task." in out  # grpo.group_size's description
    assert "\ngrpo:\n" in out and "\n  group_size: " in out


def test_show_marks_the_values_that_differ_from_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _mmrl(["config", "show", str(ROOT / "configs" / "maze-tiny-cpu.yaml")], capsys)
    assert status == 0
    assert "  max_tokens: 1  # default: 8\n" in out  # the file sets it
    assert "  top_p: 1.0\n" in out  # the file repeats the default
    assert "model: .mmrl/models/tiny  # required\n" in out


@pytest.mark.parametrize("name", SFT_CONFIGS)
def test_show_tells_an_sft_config_by_its_keys(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _mmrl(["config", "show", str(ROOT / "configs" / name)], capsys)
    assert status == 0 and not err
    assert out.startswith("# SFT config ")
    assert "# Optimiser updates on expert conversations (the SFT budget)." in out
    assert yaml.safe_load(out)["base_model"] == ".mmrl/models/tiny"


def test_show_takes_overrides_as_words_and_with_set(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(ROOT / "configs" / "maze-tiny-cpu.yaml")
    status, out, _ = _mmrl(["config", "show", path, "grpo.group_size=4", "--set", "steps=3", "--json"], capsys)
    shown = json.loads(out)
    assert status == 0 and shown["kind"] == "run"
    assert (shown["config"]["grpo"]["group_size"], shown["config"]["steps"]) == (4, 3)
    setting = next(s for s in shown["settings"] if s["path"] == "grpo.group_size")
    assert setting == {"path": "grpo.group_size", "value": 4, "default": 8, "required": False, "differs": True,
                       "type": "int, >= 2, <= 256", "description": "G: episodes per task, all on the same task."}
    assert all(s["description"] for s in shown["settings"])


def test_validate_says_ok_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for name in RUN_CONFIGS + SFT_CONFIGS:
        status, out, err = _mmrl(["config", "validate", str(ROOT / "configs" / name)], capsys)
        assert status == 0 and not err and out.startswith("ok: ") and out.count("\n") == 1, (name, out)
    status, out, _ = _mmrl(["config", "validate", str(ROOT / "configs" / "sft-maze-tiny.yaml"), "--json"], capsys)
    assert json.loads(out)["ok"] is True and json.loads(out)["kind"] == "sft"


def test_a_bad_config_is_one_line_naming_the_file_and_the_field_and_exit_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "run.yaml"
    bad.write_text("model: m\ngrpo:\n  group_size: 1\n  grup_size: 4\n")
    status, out, err = _mmrl(["config", "validate", str(bad)], capsys)
    assert (status, out) == (2, "")
    assert err == (f"mmrl config: {bad}: grpo.group_size: Input should be greater than or equal to 2 (got 1); "
                   "grpo.grup_size: not a setting here (misspelt?)\n")
    status, _, err = _mmrl(["config", "validate", str(ROOT / "configs" / "sft-maze-tiny.yaml"), "updates=-5"], capsys)
    assert status == 2 and err.endswith("updates: Input should be greater than or equal to 0 (got -5)\n")
    bad.write_text("model: m\ngrpo: [1\n")
    status, _, err = _mmrl(["config", "show", str(bad)], capsys)
    assert status == 2 and err.startswith(f"mmrl config: {bad}: not valid YAML") and err.count("\n") == 1


def test_a_missing_file_and_a_file_of_no_known_kind_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _mmrl(["config", "validate", str(tmp_path / "nope.yaml")], capsys)
    assert (status, err) == (2, f"mmrl config: cannot read the config file {tmp_path / 'nope.yaml'}: "
                                "No such file or directory\n")
    other = tmp_path / "other.yaml"
    other.write_text("steps: 3\n")
    status, _, err = _mmrl(["config", "validate", str(other)], capsys)
    assert status == 2 and err.endswith("pass --kind run or --kind sft\n") and err.count("\n") == 1
    status, _, err = _mmrl(["config", "validate", str(other), "--kind", "run"], capsys)
    assert (status, err) == (2, f"mmrl config: {other}: model: required, not given\n")
