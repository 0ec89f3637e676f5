"""Where the demo's and the sweep's GRPO starts: the env's shipped SFT config, or, for an env with
none (the Gymnasium presets), the base model itself."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mmrl.cli import demo
from mmrl.demo.starts import from_scratch


def _resolved(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_common_options(parser, "demo")
    args = parser.parse_args(argv)
    demo.resolve_common(parser, args)
    return args


def test_an_env_with_a_shipped_sft_config_warms_up_with_it() -> None:
    assert _resolved(["--env", "maze"]).sft_config.name == "sft-maze-tiny.yaml"


def test_a_preset_without_one_trains_from_the_base_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _resolved(["--env", "frozenlake-4x4"])
    assert args.sft_config is None and args.config.name == "frozenlake-4x4-tiny-cpu.yaml"
    assert from_scratch("frozenlake-4x4", tmp_path) == tmp_path
    assert "GRPO starts from the base model" in capsys.readouterr().out
