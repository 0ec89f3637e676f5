"""README.md's list of REST routes is the API's: every `/v1` route the coordinator's app serves is
named there (`METHOD /v1/...` in code spans; `[...]` optional parts, `{...}` a path parameter or a
choice of words), and nothing more."""

from __future__ import annotations

import re

import pytest

from tests.docs.doc_commands import ROOT

ROUTE = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/v1/[^`\s]*)`")


def _expand(path: str) -> list[str]:
    """`a[/b[/c]]` -> a, a/b, a/b/c."""
    match = re.search(r"\[([^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)?)\]$", path)
    if not match:
        return [path]
    head = path[: match.start()]
    return [head, *(head + tail for tail in _expand(match.group(1)))]


def _normal(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def routes_named(text: str) -> set[tuple[str, str]]:
    return {(method, _normal(p)) for method, path in ROUTE.findall(text) for p in _expand(path)}


def api_routes() -> set[tuple[str, str]]:
    from services.coordinator.api.app import create_app

    return {(method, _normal(route.path)) for route in create_app().routes
            if getattr(route, "path", "").startswith("/v1") for method in getattr(route, "methods", ())}


def test_the_readme_names_every_v1_route_and_no_other() -> None:
    served = api_routes()
    assert len(served) >= 14
    named = routes_named((ROOT / "README.md").read_text())
    assert named == served, {"not in README": served - named, "not served": named - served}


@pytest.mark.parametrize("dropped", ["`GET /v1/runs/{id}/adapters`, ", "`POST /v1/configs/parse` "])
def test_a_route_missing_from_the_readme_fails_the_check(dropped: str) -> None:
    text = (ROOT / "README.md").read_text()
    assert dropped in text
    assert routes_named(text.replace(dropped, "", 1)) != api_routes()
