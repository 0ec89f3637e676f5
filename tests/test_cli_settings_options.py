"""Options generated from a settings model (services/common/settings_cli.py): a flag per field with
the field's description, default and environment variables as help; a flag given overrides the
environment, one not given leaves it; pydantic parses every value; settings go back to flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import pytest
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.settings_cli import add_model_options, given_values, settings_argv, settings_from
from services.common.user_errors import UsageError


class Toy(BaseSettings):
    """Settings of a toy service."""

    model_config = SettingsConfigDict(env_prefix="TOY_", extra="forbid", use_attribute_docstrings=True)

    port: int = Field(default=1, ge=0, le=65535)
    """Port; 100% of requests go there."""
    root: Path = Field(default=Path("/r"), validation_alias=AliasChoices("SHARED_ROOT", "TOY_ROOT"))
    """Root directory."""
    threads: int | None = None
    """Threads (None: the library's default)."""
    cache: bool = True
    """Keep a cache."""
    mode: Literal["a", "b"] = "a"
    """Mode."""
    hosts: list[str] = Field(default_factory=list)
    """Hosts."""
    config_file: Path | None = None
    """A file."""


def _parse(argv: list[str]) -> Toy:
    parser = argparse.ArgumentParser(prog="toy")
    add_model_options(parser, Toy, renamed={"config_file": ["--config"]})
    return settings_from(Toy, given_values(parser.parse_args(argv), Toy))


def test_a_flag_overrides_the_environment_and_an_absent_one_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_PORT", "7")
    monkeypatch.setenv("SHARED_ROOT", "/from-env")
    assert (_parse([]).port, _parse([]).root) == (7, Path("/from-env"))
    assert (_parse(["--port", "8"]).port, _parse(["--root", "/flag"]).root) == (8, Path("/flag"))


def test_values_are_parsed_by_the_model() -> None:
    toy = _parse(["--threads", "4", "--no-cache", "--mode", "b", "--hosts", "[x, y]", "--config", "c.yaml"])
    assert (toy.threads, toy.cache, toy.mode, toy.hosts, toy.config_file) == (4, False, "b", ["x", "y"], Path("c.yaml"))
    assert _parse(["--threads", "none"]).threads is None


def test_a_bad_value_names_the_setting_its_flag_and_its_variables() -> None:
    with pytest.raises(UsageError, match=r"^port \(--port, TOY_PORT\): Input should be less than or equal to 65535"):
        _parse(["--port", "70000"])
    with pytest.raises(UsageError, match=r"^mode \(--mode, TOY_MODE\): Input should be 'a' or 'b' \(got 'c'\)$"):
        _parse(["--mode", "c"])


def test_the_help_gives_description_default_and_environment() -> None:
    parser = argparse.ArgumentParser(prog="toy")
    add_model_options(parser, Toy, renamed={"config_file": ["--config"]})
    text = " ".join(parser.format_help().split())
    assert "--port INT Port; 100% of requests go there. Default: 1. Environment: TOY_PORT." in text
    assert "--root PATH Root directory. Default: /r. Environment: SHARED_ROOT, TOY_ROOT." in text
    assert "--cache, --no-cache Keep a cache. Default: on." in text
    assert "--config-file PATH, --config PATH" in text and "--mode {a,b}" in text


def test_settings_go_back_to_flags_that_give_the_same_settings() -> None:
    toy = _parse(["--port", "9", "--no-cache", "--hosts", "[x]", "--root", "/q"])
    argv = settings_argv(toy)
    assert "--port=9" in argv and "--no-cache" in argv and not any(a.startswith("--threads") for a in argv)
    assert _parse(argv) == toy
