"""`mmrl run start --watch` and `mmrl run watch` end with the same exit status for the same run state."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from mmrl.cli import run as run_cli

ROOT = Path(__file__).resolve().parents[1]


class EndedApi:
    """Every run it is asked about has ended in `state`."""

    state = "succeeded"

    def __init__(self, url: str, token: str = "") -> None:
        pass

    def start(self, config: dict[str, Any], priority: int | None = None) -> dict[str, Any]:
        return {"id": "r1"}

    def run(self, run_id: str) -> dict[str, Any]:
        return {"id": run_id, "state": self.state, "step": 3, "steps": 3, "failure_reason": ""}


@pytest.mark.parametrize(("state", "status"), [("succeeded", 0), ("paused", 0), ("failed", 1), ("stopped", 1)])
def test_both_watches_give_the_same_exit_status(monkeypatch: pytest.MonkeyPatch, state: str, status: int) -> None:
    monkeypatch.setattr(run_cli, "ApiClient", type("Api", (EndedApi,), {"state": state}))
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert run_cli.main(["watch", "r1"]) == status
    assert run_cli.main(["start", "--config", str(ROOT / "configs" / "maze-tiny-cpu.yaml"), "--watch"]) == status
