"""A sweep's runs as one distribution: per eval step the worst, mean and best greedy solve rate, and per
figure of a run (the end as the mean of its last evals, the last eval within the time budget and its
gain over the start, the held-out set at the start and at the end, that gain and the share of the set
failed in loops) the worst, mean and best over the runs. Pure functions over the runs' summaries and
curves."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from mmrl.report.plots import write_json

FIGURES = ("start_solve_rate", "end_solve_rate", "end_solve_rate_last3", "within_budget_solve_rate",
           "within_budget_gain", "held_out_start_solve_rate", "held_out_solve_rate", "held_out_gain",
           "held_out_start_loops", "held_out_loops")
GAINS = ("within_budget_gain", "held_out_gain")  # printed with their sign
LOWER_IS_BETTER = ("held_out_start_loops", "held_out_loops")  # worst is their highest


def _less(end: Any, start: Any) -> float | None:
    return float(end) - float(start) if end is not None and start is not None else None


def with_gain(run: dict[str, Any]) -> dict[str, Any]:
    """`run` with its gains: `within_budget_gain`, its last greedy eval within the time budget less its
    start, and `held_out_gain`, the held-out set's greedy rate after the last step less the start's (each
    None without either side)."""
    return {**run, "within_budget_gain": _less(run.get("within_budget_solve_rate"), run.get("start_solve_rate")),
            "held_out_gain": _less(run.get("held_out_solve_rate"), run.get("held_out_start_solve_rate"))}


def spread(values: list[float], lower_is_better: bool = False) -> dict[str, float] | None:
    """worst, mean and best of `values` (None when there are none)."""
    if not values:
        return None
    worst, best = (max(values), min(values)) if lower_is_better else (min(values), max(values))
    return {"worst": worst, "mean": sum(values) / len(values), "best": best, "num": len(values)}


def figure_spread(runs: list[dict[str, Any]], name: str) -> dict[str, float] | None:
    """The spread of figure `name` over the runs that have it."""
    return spread([float(r[name]) for r in runs if r.get(name) is not None], name in LOWER_IS_BETTER)


def band(curves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per eval step that every run reached: the worst, mean and best greedy solve rate over the runs."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for curve in curves:
        for point in curve["eval"]:
            by_step[int(point["step"])].append(float(point["greedy_solve_rate"]))
    return [{"step": step, **(spread(rates) or {})} for step, rates in sorted(by_step.items())
            if len(rates) == len(curves)]


def aggregate(runs: list[dict[str, Any]], curves: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's aggregate: `band` over the curves, `figures` (each figure's spread over the runs that
    succeeded), `by_start` (the same per SFT start), and the runs in one line each."""
    runs = [with_gain(r) for r in runs]
    succeeded = [r for r in runs if r.get("state") == "succeeded"]
    figures = {name: figure_spread(succeeded, name) for name in FIGURES}
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in succeeded:
        starts[str(run.get("start", ""))].append(run)
    by_start = {start: {name: figure_spread(group, name) for name in FIGURES} for start, group in starts.items()}
    steps = [float(r["mean_step_s"]) for r in succeeded if r.get("mean_step_s") is not None]
    return {
        "num_runs": len(runs), "num_succeeded": len(succeeded), "band": band(curves), "figures": figures,
        "by_start": by_start, "mean_step_s": sum(steps) / len(steps) if steps else None,
        "runs": [{k: r.get(k) for k in ("start", "seed", "run_id", "state", "steps", "mean_step_s", *FIGURES)}
                 for r in runs],
    }


def plot_band(result: dict[str, Any], curves: list[dict[str, Any]], path: Path, title: str) -> None:
    """Every run's greedy curve, thin, and the band (worst to best) with its mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for curve in curves:
        ax.plot([p["step"] for p in curve["eval"]], [p["greedy_solve_rate"] for p in curve["eval"]],
                color="tab:blue", alpha=0.25, linewidth=1)
    points = result["band"]
    steps = [p["step"] for p in points]
    ax.fill_between(steps, [p["worst"] for p in points], [p["best"] for p in points], color="tab:blue", alpha=0.2,
                    label=f"worst to best of {len(curves)} runs")
    ax.plot(steps, [p["mean"] for p in points], "o-", color="tab:blue", label="mean (greedy)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("solve rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_sweep(out: Path, result: dict[str, Any], summaries: list[dict[str, Any]],
                curves: list[dict[str, Any]]) -> None:
    """`out`/sweep.json, and `out`/band.png over the curves of the runs that succeeded (if any did)."""
    write_json(out / "sweep.json", result)
    if result["num_succeeded"]:
        plot_band(result, [c for c, s in zip(curves, summaries, strict=True) if s.get("state") == "succeeded"],
                  out / "band.png", f"GRPO sweep ({result['env']}): {result['num_succeeded']} runs")


def figure_lines(figures: dict[str, Any]) -> list[str]:
    """A sweep's headline figures, a line each: worst, mean and best over its runs."""
    lines = []
    for name in ("end_solve_rate_last3", "within_budget_solve_rate", "within_budget_gain", "held_out_solve_rate",
                 "held_out_gain", "held_out_loops"):
        if figures.get(name):
            f = figures[name]
            fmt = "+.3f" if name in GAINS else ".3f"  # a gain carries its sign
            lines.append(f"{name}: worst {f['worst']:{fmt}}, mean {f['mean']:{fmt}}, best {f['best']:{fmt}} "
                         f"over {f['num']} runs")
    return lines
