"""`mmrl eval` refuses bad arguments before it starts any service."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrl.cli import eval as eval_cli


def test_a_model_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no config.json"):
        eval_cli.main(["--model", str(tmp_path)])


def test_a_negative_sample_count_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="--samples -1: must be 0 or more"):
        eval_cli.main(["--model", str(tmp_path), "--samples", "-1"])
