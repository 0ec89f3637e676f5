"""Quoting what a caller sent in an error message, without echoing megabytes of it back."""

from __future__ import annotations


def shown(text: str, limit: int = 64) -> str:
    """`text` quoted for an error message, cut to `limit` characters (a request may send megabytes)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
