"""Reading a config file (YAML or TOML) into a pydantic model, with `a.b=v` overrides.

Every command that reads a config goes through `load_model_file`, so a missing file, a file that
does not parse, an override that does not fit and a setting out of bounds are each one `UsageError`
naming the file and the field path.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from services.common.user_errors import UsageError, one_line

Model = TypeVar("Model", bound=BaseModel)


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's top-level mapping ({} for an empty file); ValueError when it does not parse or is
    not a mapping, OSError when it cannot be read."""
    return parse_config_text(Path(path).read_text(), str(path))


def parse_config_text(text: str, name: str) -> dict[str, Any]:
    """The top-level mapping of a config's text: TOML when `name` ends in .toml, else YAML (which
    also reads JSON); ValueError naming `name` when it does not parse or is not a mapping."""
    toml = name.endswith(".toml")
    try:
        data = tomllib.loads(text) if toml else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{name}: not valid {'TOML' if toml else 'YAML'}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{name}: expected a mapping of settings, got {type(data).__name__}")
    return data


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`["grpo.group_size=4"]` -> {"grpo.group_size": 4}: each value parsed as YAML (`4` an int,
    `[a, b]` a list, `null` None (the setting's default: `apply_overrides`), anything else as written)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"an override is KEY=VALUE (e.g. grpo.group_size=4), got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UsageError(f"override {pair}: the value is not a YAML scalar or list ({one_line(exc)})") from None
    return out


def apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Sets each dotted key of `overrides` in the nested mapping `data` (in place; returned). A value of
    None removes the key instead, so the setting takes its default: `grpo.max_sampling_rounds=null`
    undoes a file's setting that another override made idle."""
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, key in enumerate(parents):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                section = ".".join(parents[: depth + 1])
                raise UsageError(f"override {dotted}: {section} is a value ({node!r}), not a section of settings")
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


def flatten_settings(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as `{"a.b": value}`, the dotted paths overrides use."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def read_user_config(path: Path) -> dict[str, Any]:
    """`read_config_file`, its errors a UsageError naming the file."""
    try:
        return read_config_file(Path(path))
    except OSError as exc:
        raise UsageError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # its message names the file
        raise UsageError(one_line(exc)) from None


def load_model_file(model: type[Model], path: Path | None, overrides: Mapping[str, Any] | None = None) -> Model:
    """`model` from the file at `path` (None: no file, defaults) with dotted `overrides` applied;
    UsageError naming the file and what is wrong with it."""
    where = f"{path}: " if path is not None else ""
    data = read_user_config(path) if path is not None else {}
    try:
        return model.model_validate(apply_overrides(data, overrides or {}))
    except ValidationError as exc:
        raise UsageError(f"{where}{one_line(exc)}") from None
    except UsageError as exc:
        raise UsageError(f"{where}{exc}") from None
