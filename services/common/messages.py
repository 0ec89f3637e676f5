"""Text for people: quoting what a caller sent in an error message, without echoing megabytes of it
back, and the one-paragraph description a command's `--help` starts with."""

from __future__ import annotations


def shown(text: str, limit: int = 64) -> str:
    """`text` quoted for an error message, cut to `limit` characters (a request may send megabytes)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def summary(doc: str | None) -> str:
    """The first paragraph of a module docstring on one line: a command's `--help` description."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())
