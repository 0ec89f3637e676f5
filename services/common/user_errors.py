"""Errors a person can mend, and how each is told in one line.

A command that stops for its user's mistake (a bad setting, a config file that is missing or does
not parse, a misspelt option) raises `UsageError` or lets pydantic's `ValidationError` or an
`OSError` naming a file through; `mmrl` prints `one_line(error)` after the command's name and
exits 2. `CommandFailed` is a command that was used correctly but could not do its work (a service
that cannot be reached or refused a request): one line too, exit status 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from services.common.messages import shown


class UsageError(ValueError):
    """The command was used wrongly: the message says what to change (exit status 2)."""


class CommandFailed(RuntimeError):
    """The command was used correctly but could not do its work, e.g. an unreachable service (exit 1)."""


# pydantic's wording for the cases a person meets most, in the words of a config file
_MESSAGES = {
    "extra_forbidden": "not a setting here (misspelt?)",
    "missing": "required, not given",
}


def validation_line(error: ValidationError, named: Callable[[str], str] = str) -> str:
    """Every problem pydantic found, as `path.to.field: what is wrong (got X)`, joined by '; ';
    `named` may say more about a path (e.g. the flag and environment variable that set it)."""
    problems = []
    for problem in error.errors(include_url=False):
        path = named(".".join(str(part) for part in problem["loc"]))
        message = _MESSAGES.get(problem["type"], problem["msg"])
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if path and problem["type"] not in _MESSAGES:
            message += f" (got {_shown_input(problem['input'])})"
        problems.append(f"{path}: {message}" if path else message)
    return "; ".join(" ".join(p.split()) for p in problems)


def _shown_input(value: Any) -> str:
    if isinstance(value, str):
        return shown(value, limit=40)
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def one_line(error: BaseException | str) -> str:
    """What went wrong, on one line: a ValidationError by field paths, an OSError by its file."""
    if isinstance(error, ValidationError):
        return validation_line(error)
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split())
