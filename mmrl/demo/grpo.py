"""One GRPO run of the demo or a sweep: started through the REST API of a running stack, watched to
its end, and summarised (curve.json, curve.png, solved_episode.png, summary.json in its output dir).

The summary's figures (docs/results.md reads them):
- `start_solve_rate`, `end_solve_rate`: greedy on the fixed eval set at step 0 and at the last eval;
  `end_solve_rate_last3`: the mean of the last three evals (one eval of 64 tasks swings by about 0.08
  between neighbouring steps, the mean of three by less);
- `within_budget_*`: the last eval whose GRPO steps and evals ended within `budget_min` minutes;
- `held_out_start_solve_rate`, `held_out_solve_rate`: greedy on the run's `eval.held_out_set` at step 0
  and after the last step (or None), a second measure of the gain on tasks outside the fixed set; their
  time (`held_out_eval_s`) is not part of the budget; `held_out_start_loops`, `held_out_loops`: the
  share of those held-out tasks whose greedy episode failed in a loop (stuck or cycling), and
  `held_out_start_failed`, `held_out_failed` each mode apart (docs/coordinator.md);
- `machine`: where it ran (mmrl/report/machine.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmrl.cli.run import TERMINAL, ApiClient, stop_left_running, watch
from mmrl.cli.stack import Stack, StackConfig
from mmrl.report.plots import episode_strip, last_eval_within, learning_curve, plot_curve, write_json
from services.coordinator.grpo.evaluation import FAILURE_MODES, loop_share

LAST_EVALS = 3  # the end figure averages this many evals


def watch_or_stop(api: ApiClient, run_id: str) -> dict[str, Any]:
    """Watches the run to its end. On Ctrl-C (or SIGTERM) it stops the run through the API, waits
    for the stop to land at the end of the current step (a second Ctrl-C leaves at once), and
    returns the run record marked `interrupted`, so that the caller still saves what was measured."""
    try:
        return watch(api, run_id, interval_s=2.0)
    except KeyboardInterrupt:
        pass
    print(f"\ninterrupted: stopping run {run_id} after its current step (Ctrl-C again to leave now)", flush=True)
    run = api.run(run_id)
    try:
        if run["state"] not in TERMINAL:
            api.request("POST", f"/v1/runs/{run_id}/stop")
            run = watch(api, run_id, interval_s=1.0)
    except KeyboardInterrupt:
        run = api.run(run_id)
    return {**run, "interrupted": True}


@contextlib.contextmanager
def stack_for(model: Path, config: dict[str, Any], state_dir: Path, env: str) -> Iterator[tuple[ApiClient, Path]]:
    """The stack serving `model` for runs of `config` on `env` (runs left by earlier jobs marked stopped);
    yields its API client and shared root, and stops it after. Refused when the run's history window
    is not the one `model`'s SFT trained with."""
    from mmrl.cli.eval import check_history_window
    from services.learner.policy import adapts_vision, model_module_kinds

    check_history_window(model, config.get("history_window"))
    tower = adapts_vision(model_module_kinds(model), config["lora"]["target_modules"])
    stack = Stack(StackConfig(model=model.resolve(), state_dir=state_dir, lora_rank=config["lora"]["rank"],
                              tower_lora=tower, resume_runs=False, env_name=env))
    with stack:
        stack.start()
        api = stack.client()
        stop_left_running(api)
        yield api, stack.config.shared_root


def mean_of_last(evals: list[dict[str, Any]], count: int = LAST_EVALS) -> float | None:
    """The mean greedy solve rate of the last `count` evals (of all, when there are fewer)."""
    rates = [float(e["greedy_solve_rate"]) for e in evals[-count:]]
    return sum(rates) / len(rates) if rates else None


def run_grpo(api: ApiClient, config: dict[str, Any], out: Path, shared_root: Path, budget_min: float,
             title: str) -> dict[str, Any]:
    """Runs `config` to its end (or Ctrl-C) and writes its outputs under `out`; returns the summary, whose
    `state` says how the run ended (and `interrupted` whether Ctrl-C ended it)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "run_config.json", config)
    started = time.perf_counter()
    run = api.start(config)
    print(f"GRPO run {run['id']} started; watching (API {api.http.base_url})", flush=True)
    final = watch_or_stop(api, run["id"])
    grpo_wall_s = time.perf_counter() - started
    evals = api.request("GET", f"/v1/runs/{run['id']}/evals")["evals"]
    metrics = api.request("GET", f"/v1/runs/{run['id']}/metrics")["metrics"]
    curve = learning_curve(evals, metrics)
    write_json(out / "curve.json", curve)
    if evals:
        plot_curve(curve, out / "curve.png", f"{title}, {evals[0]['episodes']} fixed eval tasks")
    summary: dict[str, Any] = {
        "state": final["state"], "interrupted": bool(final.get("interrupted")),
        "failure_reason": final.get("failure_reason", ""), "run_id": run["id"], "seed": config.get("seed"),
        "steps": final["step"], "grpo_wall_s": round(grpo_wall_s, 1), "output_dir": str(out.resolve()),
        "start_solve_rate": evals[0]["greedy_solve_rate"] if evals else None,
        "end_solve_rate": evals[-1]["greedy_solve_rate"] if evals else None,
        "end_step": evals[-1]["step"] if evals else None,
        "end_solve_rate_last3": mean_of_last(evals),
        "held_out_set": evals[0].get("held_out_set") if evals else None,
        "held_out_start_solve_rate": evals[0].get("held_out_solve_rate") if evals else None,
        "held_out_solve_rate": evals[-1].get("held_out_solve_rate") if len(evals) > 1 else None,
    }
    for key, point in (("held_out_start", evals[0] if evals else {}), ("held_out", evals[-1] if len(evals) > 1 else {})):
        failed = held_out_failures(point)
        summary[f"{key}_failed"] = failed
        summary[f"{key}_loops"] = loop_share(failed) if failed else None
    if final["state"] != "succeeded" or not evals:
        write_json(out / "summary.json", summary)
        return summary
    within = last_eval_within(curve, budget_min * 60)
    final_adapter = shared_root / "runs" / run["id"] / "adapters" / f"v{final['adapter_version']:06d}"
    summary.update({
        "start_sampled_solve_rate": evals[0].get("sampled_solve_rate"),
        "end_sampled_solve_rate": evals[-1].get("sampled_solve_rate"),
        "start_sampled_pass_rate": evals[0].get("sampled_pass_rate"),
        "end_sampled_pass_rate": evals[-1].get("sampled_pass_rate"),
        "budget_min": budget_min,
        "within_budget_step": within["step"] if within else None,
        "within_budget_solve_rate": within["greedy_solve_rate"] if within else None,
        "within_budget_grpo_s": round(within["grpo_s"], 1) if within else None,
        "mean_step_s": round(sum(m.get("time/step_s", 0) for m in metrics) / max(len(metrics), 1), 2),
        "final_adapter_dir": str(final_adapter.resolve()), "curve_png": str((out / "curve.png").resolve()),
        "solved_episode_png": _solved_strip(api, run["id"], evals[-1]["step"], shared_root, out),
    })
    write_json(out / "summary.json", summary)
    return summary


def held_out_failures(point: dict[str, Any]) -> dict[str, float] | None:
    """How an eval's held-out episodes failed (`stuck`, `cycling`, `other`, shares of the set), or None
    where the eval played no held-out set."""
    keys = {mode: f"held_out_failed_{mode}" for mode in FAILURE_MODES}
    if any(point.get(key) is None for key in keys.values()):
        return None
    return {mode: float(point[key]) for mode, key in keys.items()}


def _solved_strip(api: ApiClient, run_id: str, step: int, shared_root: Path, out: Path) -> str | None:
    """The longest solved greedy episode of the last eval as an image strip (None when none kept frames)."""
    episodes = api.request("GET", f"/v1/runs/{run_id}/episodes", params={"kind": "eval", "step": step})["episodes"]
    solved = [e for e in episodes if e["step"] == step and e["solved"] and e["frames"]]
    if not solved:
        return None
    best = max(solved, key=lambda e: len(e["frames"]))
    strip = out / "solved_episode.png"
    run_dir = shared_root / "runs" / run_id  # frames are listed relative to it
    episode_strip([run_dir / f for f in best["frames"]], best["actions"], strip)
    return str(strip.resolve())


def print_summary(summary: dict[str, Any], budget_min: float) -> None:
    """The run's figures in a few lines."""
    if summary["state"] != "succeeded":
        reason = f": {summary['failure_reason']}" if summary.get("failure_reason") else ""
        print(f"the run ended {summary['state']} at step {summary['steps']}{reason}; the curve so far is in "
              f"{summary['output_dir']}/curve.json")
        return
    print(f"\neval solve rate (greedy, fixed set): {summary['start_solve_rate']:.3f} at step 0 -> "
          f"{summary['end_solve_rate']:.3f} at step {summary['end_step']} (mean of the last {LAST_EVALS} evals "
          f"{summary['end_solve_rate_last3']:.3f})")
    if summary.get("within_budget_step") is not None:
        print(f"within {budget_min:g} min of GRPO: {summary['within_budget_solve_rate']:.3f} at step "
              f"{summary['within_budget_step']} ({summary['within_budget_grpo_s']:.0f} s of steps and evals)")
    if summary.get("held_out_solve_rate") is not None:
        start = summary.get("held_out_start_solve_rate")
        print(f"held out ({summary['held_out_set']}): " + (f"{start:.3f} at step 0 -> " if start is not None else "")
              + f"{summary['held_out_solve_rate']:.3f} after the last step")
        if summary.get("held_out_loops") is not None:
            start_loops = summary.get("held_out_start_loops")
            print("held out failed in a loop (stuck or cycling): "
                  + (f"{start_loops:.3f} at step 0 -> " if start_loops is not None else "")
                  + f"{summary['held_out_loops']:.3f} after the last step")
