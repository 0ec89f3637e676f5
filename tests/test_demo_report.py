"""The demo's curve: the GRPO seconds spent by each eval, and the last eval within a time budget."""

from __future__ import annotations

from typing import Any

import pytest

from mmrl.report.plots import grpo_seconds, last_eval_within, learning_curve


def _eval(step: int, rate: float, eval_s: float | None) -> dict[str, Any]:
    record: dict[str, Any] = {"step": step, "greedy_solve_rate": rate, "adapter_version": step}
    if eval_s is not None:
        record["eval_s"] = eval_s
    return record


def _metric(step: int, step_s: float | None) -> dict[str, Any]:
    record: dict[str, Any] = {"step": step, "reward/mean": 0.5}
    if step_s is not None:
        record["time/step_s"] = step_s
    return record


EVALS = [_eval(0, 0.5, 3.0), _eval(2, 0.6, 4.0), _eval(4, 0.7, 5.0)]
METRICS = [_metric(1, 10.0), _metric(2, 20.0), _metric(3, 30.0), _metric(4, 40.0)]


def test_each_eval_counts_the_steps_and_evals_up_to_it() -> None:
    assert grpo_seconds(EVALS, METRICS) == {0: 3.0, 2: 3.0 + 10 + 20 + 4, 4: 3.0 + 100 + 4 + 5}


def test_the_curve_carries_the_seconds_and_the_budget_picks_the_last_eval_inside_it() -> None:
    curve = learning_curve(EVALS, METRICS)
    assert [e["grpo_s"] for e in curve["eval"]] == [3.0, 37.0, 112.0]
    assert last_eval_within(curve, 111.9)["step"] == 2  # type: ignore[index]
    assert last_eval_within(curve, 112.0)["greedy_solve_rate"] == 0.7  # type: ignore[index]
    assert last_eval_within(curve, 2.9) is None


@pytest.mark.parametrize("evals, metrics", [
    ([_eval(0, 0.5, None), _eval(2, 0.6, 4.0)], METRICS[:2]),
    (EVALS[:2], [_metric(1, 10.0), _metric(2, None)]),
])
def test_a_record_without_its_time_leaves_the_seconds_out(evals, metrics) -> None:
    assert grpo_seconds(evals, metrics) == {}
    curve = learning_curve(evals, metrics)
    assert all(e["grpo_s"] is None for e in curve["eval"])
    assert last_eval_within(curve, 1e9) is None


@pytest.mark.parametrize("minutes", ["0", "-5"])
def test_the_demo_refuses_a_budget_that_is_not_positive(minutes: str, capsys) -> None:
    from mmrl.cli import demo

    with pytest.raises(SystemExit) as exc:
        demo.main(["--budget-min", minutes, "--model", "/nonexistent/model"])
    assert exc.value.code == 2
    assert "--budget-min must be positive" in capsys.readouterr().err


def test_the_curve_carries_how_failed_greedy_episodes_failed() -> None:
    modes = {"greedy_noop_fraction": 0.3, "greedy_failed_stuck": 0.2, "greedy_failed_cycling": 0.1}
    (point,) = learning_curve([{**_eval(0, 0.7, 3.0), **modes}], [])["eval"]
    assert {key: point[key] for key in modes} == modes


class _FinishedRunApi:
    """A run that has ended: its evals and metrics as the coordinator's REST API returns them."""

    def __init__(self, evals: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> None:
        self.answers = {"/v1/runs/r1/evals": {"evals": evals}, "/v1/runs/r1/metrics": {"metrics": metrics},
                        "/v1/runs/r1/episodes": {"episodes": []}}
        self.http = type("Http", (), {"base_url": "http://test"})()

    def start(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"id": "r1"}

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.answers[path]


def _summary(monkeypatch, tmp_path, evals: list[dict[str, Any]], state: str = "succeeded") -> dict[str, Any]:
    from mmrl.demo import grpo

    evals = [{**e, "episodes": 64} for e in evals]
    final = {"id": "r1", "state": state, "step": evals[-1]["step"], "adapter_version": evals[-1]["step"]}
    monkeypatch.setattr(grpo, "watch_or_stop", lambda api, run_id: final)
    api = _FinishedRunApi(evals, [m for m in METRICS if m["step"] <= evals[-1]["step"]])
    return grpo.run_grpo(api, {"seed": 0}, tmp_path / "out", tmp_path / "shared", 30.0, "test")  # type: ignore[arg-type]


def test_the_summary_has_the_held_out_rate_of_the_start_and_of_the_end(monkeypatch, tmp_path) -> None:
    """The step-0 eval and the last play the held-out set; the summary keeps both, and the budget counts
    the fixed set's evals alone (eval_s), not the held-out ones (held_out_eval_s)."""
    held_out = {"held_out_set": "maze-held-out-256", "held_out_eval_s": 1000.0}
    evals = [{**_eval(0, 0.5, 3.0), **held_out, "held_out_solve_rate": 0.4}, _eval(2, 0.6, 4.0),
             {**_eval(4, 0.7, 5.0), **held_out, "held_out_solve_rate": 0.65}]
    summary = _summary(monkeypatch, tmp_path, evals)
    assert (summary["held_out_set"], summary["held_out_start_solve_rate"], summary["held_out_solve_rate"]) == (
        "maze-held-out-256", 0.4, 0.65)
    assert summary["within_budget_step"] == 4 and summary["within_budget_grpo_s"] == 112.0


def test_a_run_that_ended_before_its_second_eval_has_no_held_out_end(monkeypatch, tmp_path) -> None:
    evals = [{**_eval(0, 0.5, 3.0), "held_out_set": "maze-held-out-256", "held_out_solve_rate": 0.4}]
    summary = _summary(monkeypatch, tmp_path, evals, state="failed")
    assert summary["held_out_start_solve_rate"] == 0.4 and summary["held_out_solve_rate"] is None


def test_the_summary_has_how_the_held_out_episodes_failed_at_the_start_and_at_the_end(monkeypatch, tmp_path) -> None:
    def failed(stuck: float, cycling: float, other: float) -> dict[str, Any]:
        return {"held_out_set": "sokoban-held-out-512", "held_out_solve_rate": 1 - stuck - cycling - other,
                "held_out_failed_stuck": stuck, "held_out_failed_cycling": cycling, "held_out_failed_other": other}

    evals = [{**_eval(0, 0.5, 3.0), **failed(0.25, 0.125, 0.125)}, _eval(2, 0.6, 4.0),
             {**_eval(4, 0.7, 5.0), **failed(0.125, 0.25, 0.0)}]
    summary = _summary(monkeypatch, tmp_path, evals)
    assert summary["held_out_start_failed"] == {"stuck": 0.25, "cycling": 0.125, "other": 0.125}
    assert summary["held_out_failed"] == {"stuck": 0.125, "cycling": 0.25, "other": 0.0}
    assert (summary["held_out_start_loops"], summary["held_out_loops"]) == (0.375, 0.375)


def test_an_eval_without_the_held_out_modes_gives_no_loop_share(monkeypatch, tmp_path) -> None:
    """A run recorded before the held-out evals kept their failure modes (or without a held-out set)."""
    held_out = {"held_out_set": "maze-held-out-256", "held_out_solve_rate": 0.4}
    summary = _summary(monkeypatch, tmp_path, [{**_eval(0, 0.5, 3.0), **held_out}, {**_eval(2, 0.6, 4.0), **held_out}])
    assert summary["held_out_start_failed"] is None and summary["held_out_loops"] is None
