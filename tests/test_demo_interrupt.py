"""`mmrl demo` on Ctrl-C: the run is stopped through the API and its record comes back marked."""

from __future__ import annotations

import io
from typing import Any

import pytest

from mmrl.cli import demo
from mmrl.demo import grpo
from services.common.user_errors import UsageError


class ScriptedApi:
    """Answers GET /v1/runs/{id} from a script; an entry that is an exception is raised instead."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.posted: list[str] = []

    def run(self, run_id: str) -> dict[str, Any]:
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return {"id": run_id, "step": item[1], "steps": 10, "state": item[0], "failure_reason": ""}

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.posted.append(f"{method} {path}")
        return {}


def _quiet(monkeypatch) -> None:
    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.setattr("mmrl.cli.run.time.sleep", lambda s: None)


def test_ctrl_c_stops_the_run_and_waits_for_the_stop(monkeypatch) -> None:
    _quiet(monkeypatch)
    api = ScriptedApi([("running", 3), KeyboardInterrupt(), ("running", 3), ("running", 4), ("stopped", 4)])
    final = grpo.watch_or_stop(api, "r1")  # type: ignore[arg-type]
    assert api.posted == ["POST /v1/runs/r1/stop"]
    assert (final["state"], final["step"], final["interrupted"]) == ("stopped", 4, True)


def test_second_ctrl_c_leaves_without_waiting(monkeypatch) -> None:
    _quiet(monkeypatch)
    api = ScriptedApi([KeyboardInterrupt(), ("running", 2), KeyboardInterrupt(), ("running", 2)])
    final = grpo.watch_or_stop(api, "r1")  # type: ignore[arg-type]
    assert api.posted == ["POST /v1/runs/r1/stop"]
    assert (final["state"], final["interrupted"]) == ("running", True)


def test_a_run_that_already_ended_is_not_stopped_again(monkeypatch) -> None:
    _quiet(monkeypatch)
    api = ScriptedApi([KeyboardInterrupt(), ("succeeded", 10)])
    final = grpo.watch_or_stop(api, "r1")  # type: ignore[arg-type]
    assert api.posted == []
    assert final["state"] == "succeeded" and final["interrupted"]


def test_without_interruption_the_final_record_is_returned_unmarked(monkeypatch) -> None:
    _quiet(monkeypatch)
    api = ScriptedApi([("running", 9), ("succeeded", 10)])
    final = grpo.watch_or_stop(api, "r1")  # type: ignore[arg-type]
    assert final["state"] == "succeeded" and "interrupted" not in final


def test_runs_an_earlier_demo_left_active_are_stopped_before_a_new_one(monkeypatch) -> None:
    _quiet(monkeypatch)
    runs = [{"id": f"r-{state}", "state": state, "step": 3}
            for state in ("queued", "pending", "running", "paused", "succeeded", "stopped", "failed")]

    class Listing(ScriptedApi):
        def request(self, method: str, path: str, **kwargs: Any) -> Any:
            super().request(method, path)
            state = kwargs.get("params", {}).get("state")  # the listing's filter
            return {"runs": [r for r in runs if r["state"] == state]} if path == "/v1/runs" else {}

    api = Listing([])
    grpo.stop_left_running(api)  # type: ignore[arg-type]
    assert api.posted == ["GET /v1/runs", "GET /v1/runs", "GET /v1/runs", "POST /v1/runs/r-queued/stop",
                          "POST /v1/runs/r-pending/stop", "POST /v1/runs/r-running/stop"]


def test_a_bad_run_config_is_refused_before_the_sft_runs(monkeypatch, tmp_path) -> None:
    def no_sft(*args: Any) -> Any:
        raise AssertionError("the SFT ran before the run config was checked")

    monkeypatch.setattr(demo, "sft_checkpoint", no_sft)
    monkeypatch.setattr(demo, "ensure_tiny_model", lambda path: tmp_path)
    for bad, error in ((["--set", "grpo.group_sise=4"], "grpo.group_sise: not a setting here"),
                       (["--steps", "0"], "steps: Input should be greater than or equal to 1"),
                       (["grpo.group_size=1"], "grpo.group_size: Input should be greater than or equal to 2")):
        with pytest.raises(UsageError, match=error):
            demo.main(["--state-dir", str(tmp_path), "--out", str(tmp_path / "out"), *bad])
