"""Reading a service's config file: YAML (.yaml/.yml) or TOML (.toml), as a plain dict."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's top-level mapping ({} for an empty file); ValueError when it is not a mapping."""
    text = Path(path).read_text()
    data = tomllib.loads(text) if Path(path).suffix == ".toml" else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data
