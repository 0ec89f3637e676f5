"""`mmrl bench e2e --json` on a run that fails: exit status 1, and the last line is still one JSON
object (with the run's state and reason). The stack is replaced by a stand-in; the real stack runs
in tests/e2e."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mmrl.bench import e2e as bench_e2e

ROOT = Path(__file__).resolve().parents[1]


class FailedRunApi:
    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if path == "/v1/runs":
            return {"runs": []}
        return {"metrics": [{"time/step_s": 1.0}], "evals": []}

    def start(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"id": "r1"}


class StandInStack:
    def __init__(self, config: Any) -> None:
        self.config = config

    def __enter__(self) -> StandInStack:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def start(self, log: bool = True) -> None:
        pass

    def client(self) -> FailedRunApi:
        return FailedRunApi()


def test_a_failed_run_ends_with_a_json_line_and_exit_status_1(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_e2e, "ensure_tiny_model", lambda path: tmp_path)
    monkeypatch.setattr(bench_e2e, "Stack", StandInStack)
    monkeypatch.setattr(bench_e2e, "watch", lambda api, run_id, interval_s: {
        "id": run_id, "state": "failed", "failure_reason": "learner service at x: TrainStep failed"})
    assert bench_e2e.main(["--config", str(ROOT / "configs" / "maze-tiny-cpu.yaml"), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1]) == {
        "state": "failed", "failure_reason": "learner service at x: TrainStep failed", "run_id": "r1", "steps": 1}
    assert "bench run ended failed" in captured.err
