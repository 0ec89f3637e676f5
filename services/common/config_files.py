"""Reading a service's config file: YAML (.yaml/.yml) or TOML (.toml), as a plain dict."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's top-level mapping ({} for an empty file); ValueError when it does not parse or is
    not a mapping, OSError when it cannot be read."""
    return parse_config_text(Path(path).read_text(), toml=Path(path).suffix == ".toml", where=str(path))


def parse_config_text(text: str, *, toml: bool, where: str) -> dict[str, Any]:
    """The top-level mapping of a config file's text ({} for empty text); ValueError naming `where`
    when it does not parse or is not a mapping."""
    try:
        data = tomllib.loads(text) if toml else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{where}: not valid {'TOML' if toml else 'YAML'}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    return data
