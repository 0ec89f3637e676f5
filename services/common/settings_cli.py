"""Command-line options generated from a pydantic model's fields, so that a service's flags, their
help and its environment variables all come from one definition of each setting.

`add_model_options` adds `--field-name` for every field (help: the field's description, default and,
for a `BaseSettings`, its environment variables). Options default to "not given", so only the flags
on the command line override what the environment or a config file says; values stay text and
pydantic parses and checks them, so a flag out of bounds is the same one-line error as a bad
environment variable or config file. `settings_from` builds a `BaseSettings` from the environment
with the flags on top; `settings_argv` turns settings back into flags (for a re-executed process).
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import AliasChoices, BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from services.common.user_errors import UsageError, validation_line

Settings = TypeVar("Settings", bound=BaseSettings)
_STRUCTURED = (BaseModel, list, tuple, dict, set, frozenset)
_METAVARS = {str: "TEXT", int: "INT", float: "NUMBER", Path: "PATH"}


def option_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types a field takes, None left out (`int | None` -> (int,))."""
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def _is_text(annotation: Any) -> bool:
    """Whether a flag's text goes to pydantic as it is (a scalar), else it is parsed as YAML first."""
    for member in _members(annotation):
        if get_origin(member) is Literal:
            continue
        if get_origin(member) is not None or not isinstance(member, type) or issubclass(member, _STRUCTURED):
            return False
    return True


def _is_flag(annotation: Any) -> bool:
    return _members(annotation) == (bool,)


def env_names(settings: type[BaseModel], name: str) -> list[str]:
    """The environment variables a `BaseSettings` field is read from ([] for a plain model)."""
    if not issubclass(settings, BaseSettings):
        return []
    alias = settings.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return [c.upper() for c in alias.choices if isinstance(c, str) and c != name]
    if isinstance(alias, str):
        return [alias.upper()]
    return [(str(settings.model_config.get("env_prefix", "")) + name).upper()]


def default_of(field: FieldInfo) -> Any:
    """The field's default (a default factory called); PydanticUndefined when it is required."""
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return field.default


def _help(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    text = " ".join((field.description or "").split())
    default = default_of(field)
    if default is PydanticUndefined:
        text += " Required."
    elif _is_flag(field.annotation):
        text += f" Default: {'on' if default else 'off'}."
    elif default not in (None, ""):
        text += f" Default: {default}."
    names = [n for n in env_names(model, name) if n not in text]  # some descriptions name them already
    if names:
        text += f" Environment: {', '.join(names)}."
    return text.strip().replace("%", "%%")  # argparse %-formats help


def _metavar(annotation: Any) -> str:
    members = _members(annotation)
    if len(members) == 1 and get_origin(members[0]) is Literal:
        return "{" + ",".join(str(a) for a in get_args(members[0])) + "}"
    return "|".join(_METAVARS.get(a, getattr(a, "__name__", "value").upper()) for a in members)


def add_model_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, model: type[BaseModel], *,
                      dest_prefix: str = "", renamed: Mapping[str, Sequence[str]] | None = None,
                      skip: Collection[str] = ()) -> None:
    """`--name` for each field of `model` (besides those in `skip`); `renamed` adds further flag
    names to a field (e.g. {"config_file": ["--config"]}). Read them back with `given_values`."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flags = [option_name(name), *(renamed or {}).get(name, ())]
        common: dict[str, Any] = {"dest": dest_prefix + name, "default": argparse.SUPPRESS,
                                  "help": _help(model, name, field)}
        if _is_flag(field.annotation):
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **common)
        else:
            parser.add_argument(*flags, metavar=_metavar(field.annotation), **common)


def given_values(args: argparse.Namespace, model: type[BaseModel], dest_prefix: str = "") -> dict[str, Any]:
    """The fields of `model` given on the command line, by field name (text for pydantic to parse;
    'none' or 'null' for a field that may be None; YAML for lists and mappings)."""
    given = vars(args)
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if dest_prefix + name not in given:
            continue
        value = given[dest_prefix + name]
        if isinstance(value, str) and value.lower() in ("none", "null") and not field.is_required() \
                and type(None) in get_args(field.annotation):
            value = None
        elif isinstance(value, str) and not _is_text(field.annotation):
            value = yaml.safe_load(value)
        out[name] = value
    return out


def _init_key(settings: type[BaseSettings], name: str) -> str:
    """The keyword that sets field `name` when constructing `settings` (a field read from other
    environment variables than its own may only take their names)."""
    alias = settings.model_fields[name].validation_alias
    if alias is None or settings.model_config.get("populate_by_name"):
        return name
    if isinstance(alias, AliasChoices):
        choices = [c for c in alias.choices if isinstance(c, str)]
        return name if name in choices else choices[0]
    return str(alias)


def settings_from(settings: type[Settings], values: Mapping[str, Any]) -> Settings:
    """`settings` from the environment, with `values` (by field name: the flags given) on top;
    UsageError naming the flag and environment variables of each setting that is wrong."""
    keys = {key: name for name, field in settings.model_fields.items()  # pydantic reports a field by its alias
            for key in [name, *(field.validation_alias.choices if isinstance(field.validation_alias, AliasChoices)
                                else [field.validation_alias])] if isinstance(key, str)}

    def named(path: str) -> str:
        if path not in keys:
            return path
        name = keys[path]
        return f"{name} ({', '.join([option_name(name), *env_names(settings, name)])})"

    try:
        return settings(**{_init_key(settings, name): value for name, value in values.items()})
    except ValidationError as exc:
        raise UsageError(validation_line(exc, named)) from None


def settings_argv(settings: BaseModel, skip: Collection[str] = ()) -> list[str]:
    """The flags that give every field of `settings` that is set (not None) its value."""
    argv = []
    for name, value in settings.model_dump(mode="json").items():
        if name in skip or value is None:
            continue
        if isinstance(value, bool):
            argv.append(option_name(name) if value else "--no-" + name.replace("_", "-"))
        else:
            text = value if isinstance(value, str | int | float) else yaml.safe_dump(value, default_flow_style=True)
            argv.append(f"{option_name(name)}={str(text).strip()}")
    return argv
