"""Every setting of a pydantic model, found by walking its fields (nested models recursively): its
dotted path, type and bounds, default and description. `mmrl config show` prints a config with them
as commented YAML, `mmrl config docs` renders them as Markdown tables."""

from __future__ import annotations

import json
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from services.common.messages import summary
from services.common.settings_cli import default_of

_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "<="),
           (annotated_types.Lt, "lt", "<"), (annotated_types.MinLen, "min_length", "length >="),
           (annotated_types.MaxLen, "max_length", "length <="))


@dataclass(frozen=True)
class Setting:
    """One field of a model: a value, or a section (a nested model) holding more settings."""

    path: str
    field: FieldInfo
    depth: int
    section: type[BaseModel] | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def required(self) -> bool:
        return self.field.is_required()

    @property
    def default(self) -> Any:
        """The default as JSON (None when the setting is required)."""
        default = default_of(self.field)
        return None if default is PydanticUndefined else to_jsonable_python(default)

    @property
    def description(self) -> str:
        text = self.field.description or (summary(self.section.__doc__) if self.section else "")
        return " ".join(text.split())

    @property
    def type(self) -> str:
        bounds = [f"{sign} {getattr(item, attr)}" for item in self.field.metadata
                  for kind, attr, sign in _BOUNDS if isinstance(item, kind)]
        return ", ".join([type_name(self.field.annotation), *bounds])


def type_name(annotation: Any) -> str:
    """`int | None`, `list[str]`, `"std" | "none"`, `Path`: a type as a person reads it."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(type_name(a) for a in get_args(annotation))}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _section(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def walk(model: type[BaseModel], prefix: str = "", depth: int = 0) -> Iterator[Setting]:
    """Every field of `model` in declaration order, each section followed by its own settings."""
    for name, field in model.model_fields.items():
        section = _section(field.annotation)
        yield Setting(prefix + name, field, depth, section)
        if section is not None:
            yield from walk(section, f"{prefix}{name}.", depth + 1)


def lookup(values: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        values = values[key]
    return values


def inline_yaml(value: Any) -> str:
    """`value` as YAML on one line (JSON, which YAML reads, for text that would take several)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).removesuffix("...\n")
    return text.strip() if "\n" not in text.strip() else json.dumps(value)


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ") if text else []


def show_yaml(model: type[BaseModel], config: BaseModel, title: str) -> str:
    """The config as YAML that loads back to the same config: each setting under its description,
    with its default where the value differs from it."""
    values = config.model_dump(mode="json")
    lines = [*_comment(title, ""), *_comment(summary(model.__doc__), ""), ""]
    for setting in walk(model):
        indent = "  " * setting.depth
        if setting.section is not None:
            lines += ["", *_comment(setting.description, indent), f"{indent}{setting.name}:"]
            continue
        value = lookup(values, setting.path)
        if setting.required:
            note = "  # required"
        else:
            note = "" if value == setting.default else f"  # default: {inline_yaml(setting.default)}"
        lines += [*_comment(setting.description, indent), f"{indent}{setting.name}: {inline_yaml(value)}{note}"]
    return "\n".join(lines) + "\n"


def show_json(model: type[BaseModel], config: BaseModel) -> dict[str, Any]:
    """The config and, for each setting, its value, default, type and description."""
    values = config.model_dump(mode="json")
    settings = [{"path": s.path, "value": lookup(values, s.path), "default": s.default, "required": s.required,
                 "differs": not s.required and lookup(values, s.path) != s.default, "type": s.type,
                 "description": s.description} for s in walk(model) if s.section is None]
    return {"config": values, "settings": settings}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(value: Any, limit: int = 60) -> str:
    text = inline_yaml(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"`{_cell(text)}`" if "`" not in text else _cell(text)


def markdown_tables(model: type[BaseModel], columns: dict[str, Any] | None = None, level: int = 3) -> str:
    """`model`'s settings as Markdown tables, one per section (a heading and its description first).
    `columns` adds columns: header -> function of a Setting giving the cell."""
    extra = columns or {}
    header = ["Setting", *extra, "Type", "Default", "Description"]
    sections: dict[str, tuple[list[str], list[str]]] = {"": ([], [])}  # path -> (heading lines, rows)
    for setting in walk(model):
        if setting.section is not None:
            heading = [f"{'#' * (level + setting.depth)} `{setting.path}`", "", setting.description, ""]
            sections[setting.path] = (heading, [])
            continue
        default = "required" if setting.required else _code(setting.default)
        cells = [f"`{setting.path}`", *(_cell(f(setting)) for f in extra.values()), _cell(setting.type),
                 default, _cell(setting.description)]
        sections[setting.path.rpartition(".")[0]][1].append("| " + " | ".join(cells) + " |")
    out = []
    for heading, rows in sections.values():
        out += heading
        if rows:
            out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows, ""]
    return "\n".join(out)
