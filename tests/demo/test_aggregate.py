"""A sweep's runs as a distribution, and the machine every summary records."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmrl.demo.aggregate import aggregate, band, figure_lines, plot_band, spread
from mmrl.demo.grpo import mean_of_last
from mmrl.report.machine import cpu_model, describe, kernel_flags, machine_info


def _curve(rates: list[float]) -> dict[str, object]:
    return {"eval": [{"step": 10 * i, "greedy_solve_rate": r} for i, r in enumerate(rates)]}


def test_the_band_is_the_worst_mean_and_best_of_every_step_all_runs_reached() -> None:
    curves = [_curve([0.5, 0.7, 0.9]), _curve([0.5, 0.6, 0.8]), _curve([0.4, 0.8])]
    points = band(curves)
    assert [p["step"] for p in points] == [0, 10]  # step 20: one run stopped before it
    assert points[1] == {"step": 10, "worst": 0.6, "mean": pytest.approx(0.7), "best": 0.8, "num": 3}


def test_each_figure_spreads_over_the_runs_that_succeeded_overall_and_per_start() -> None:
    runs = [
        {"start": "a", "seed": 0, "state": "succeeded", "end_solve_rate_last3": 0.9, "held_out_solve_rate": 0.85},
        {"start": "a", "seed": 1, "state": "succeeded", "end_solve_rate_last3": 0.95, "held_out_solve_rate": None},
        {"start": "b", "seed": 0, "state": "succeeded", "end_solve_rate_last3": 0.8},
        {"start": "b", "seed": 1, "state": "failed", "end_solve_rate_last3": 0.1},
    ]
    result = aggregate(runs, [_curve([0.5])] * 4)
    assert result["num_runs"] == 4 and result["num_succeeded"] == 3
    assert result["figures"]["end_solve_rate_last3"] == {"worst": 0.8, "mean": pytest.approx(0.8833333),
                                                         "best": 0.95, "num": 3}
    assert result["figures"]["held_out_solve_rate"]["num"] == 1 and result["figures"]["start_solve_rate"] is None
    assert result["by_start"]["a"]["end_solve_rate_last3"]["worst"] == 0.9
    assert result["by_start"]["b"]["end_solve_rate_last3"]["num"] == 1
    assert [r["seed"] for r in result["runs"]] == [0, 1, 0, 1]
    assert spread([]) is None


def test_the_gain_is_the_last_eval_within_the_budget_less_the_start_of_each_run() -> None:
    runs = [
        {"seed": 0, "state": "succeeded", "start_solve_rate": 0.25, "within_budget_solve_rate": 0.5},
        {"seed": 1, "state": "succeeded", "start_solve_rate": 0.25, "within_budget_solve_rate": 0.125},
        {"seed": 2, "state": "succeeded", "start_solve_rate": 0.25},  # no eval ended within the budget
        {"seed": 3, "state": "failed", "start_solve_rate": 0.25, "within_budget_solve_rate": 1.0},
    ]
    result = aggregate(runs, [_curve([0.25])] * 4)
    assert [r["within_budget_gain"] for r in result["runs"]] == [0.25, -0.125, None, 0.75]
    assert result["figures"]["within_budget_gain"] == {"worst": -0.125, "mean": 0.0625, "best": 0.25, "num": 2}


def test_the_held_out_gain_is_the_held_out_end_less_the_held_out_start() -> None:
    runs = [
        {"seed": 0, "state": "succeeded", "held_out_start_solve_rate": 0.3, "held_out_solve_rate": 0.55},
        {"seed": 1, "state": "succeeded", "held_out_start_solve_rate": 0.3, "held_out_solve_rate": 0.25},
        {"seed": 2, "state": "succeeded", "held_out_solve_rate": 0.5},  # a run that did not play it at step 0
    ]
    result = aggregate(runs, [_curve([0.25])] * 3)
    assert [r["held_out_gain"] for r in result["runs"]] == [pytest.approx(0.25), pytest.approx(-0.05), None]
    assert result["figures"]["held_out_gain"] == {"worst": pytest.approx(-0.05), "mean": pytest.approx(0.1),
                                                  "best": pytest.approx(0.25), "num": 2}
    assert result["figures"]["held_out_start_solve_rate"]["num"] == 2
    assert "held_out_gain: worst -0.050, mean +0.100, best +0.250 over 2 runs" in figure_lines(result["figures"])


def test_the_held_out_loop_share_is_a_figure_of_the_sweep_whose_worst_is_the_highest() -> None:
    runs = [{"seed": 0, "state": "succeeded", "held_out_start_loops": 0.4, "held_out_loops": 0.25},
            {"seed": 1, "state": "succeeded", "held_out_start_loops": 0.4, "held_out_loops": 0.375}]
    result = aggregate(runs, [_curve([0.25])] * 2)
    assert [r["held_out_loops"] for r in result["runs"]] == [0.25, 0.375]
    assert result["figures"]["held_out_loops"] == {"worst": 0.375, "mean": 0.3125, "best": 0.25, "num": 2}
    assert "held_out_loops: worst 0.375, mean 0.312, best 0.250 over 2 runs" in figure_lines(result["figures"])


def test_the_end_figure_averages_the_last_three_evals() -> None:
    assert mean_of_last([{"greedy_solve_rate": r} for r in (0.1, 0.8, 0.9, 1.0)]) == pytest.approx(0.9)
    assert mean_of_last([{"greedy_solve_rate": 0.5}]) == 0.5 and mean_of_last([]) is None


def test_the_band_plot_is_written(tmp_path: Path) -> None:
    curves = [_curve([0.5, 0.7]), _curve([0.4, 0.9])]
    plot_band(aggregate([{"state": "succeeded"}] * 2, curves), curves, tmp_path / "band.png", "sweep")
    assert (tmp_path / "band.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_machine_names_its_cpu_kernel_flags_torch_and_commit() -> None:
    cpuinfo = "model name\t: AMD EPYC 7R13\nflags\t\t: fpu sse avx2 fma avx512f amx_tile\n"
    assert cpu_model(cpuinfo) == "AMD EPYC 7R13"
    assert kernel_flags(cpuinfo) == ["avx2", "avx512f", "amx_tile", "fma"]
    info = machine_info()
    assert info["cpus"] >= 1 and info["torch_threads"] >= 1 and info["commit"] not in ("", None)
    assert describe(info).startswith(f"{info['cpus']}-core ")
