"""`mmrl demo`: the main job. Builds the tiny model, runs (or reuses) the SFT warm start, starts the
stack, runs GRPO through the REST API with live progress, and writes the learning curve (JSON +
PNG), a solved eval episode as an image strip, and a summary. `--env sokoban` does the same on
Sokoban (docs/sokoban.md) with its own configs, SFT checkpoint and output directory."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from mmrl.cli.options import add_overrides, overrides_from
from mmrl.cli.run import TERMINAL, ApiClient, load_config_dict, stop_left_running, watch
from mmrl.cli.sft import load_sft_config, run_sft
from mmrl.cli.stack import Stack, StackConfig
from mmrl.cli.up import DEFAULT_MODEL, ensure_tiny_model
from mmrl.report.plots import episode_strip, last_eval_within, learning_curve, plot_curve, write_json

# --env NAME: (GRPO run config, SFT config, output directory).
ENV_CONFIGS = {
    "maze": (Path("configs/maze-tiny-cpu.yaml"), Path("configs/sft-tiny.yaml"), Path("outputs/demo")),
    "sokoban": (Path("configs/sokoban-tiny-cpu.yaml"), Path("configs/sft-sokoban-tiny.yaml"),
                Path("outputs/demo-sokoban")),
}


def sft_checkpoint(args: argparse.Namespace, base_model: Path) -> tuple[Path, float, dict[str, Any]]:
    """The SFT start: reused when a checkpoint of the same config exists, else trained now."""
    # Each environment's SFT has a directory of its own: another env's would replace the maze's cached start.
    name = "sft" if args.env == "maze" else f"sft-{args.env}"
    config = load_sft_config(args.sft_config, args.state_dir / "models" / name, base_model.resolve())
    out = Path(config.out)
    report_path = out / "sft_report.json"
    if report_path.is_file():
        report = json.loads(report_path.read_text())
        if report.get("fingerprint") == config.fingerprint() and "eval" in report:
            print(f"reusing the SFT checkpoint {out} (same config; trained in {report['sft_wall_s']:.0f} s)")
            return out, float(report["sft_wall_s"]), report
    if config.stop_above is None:
        budget = f"{config.updates} updates"
    elif config.keep == "before_first_above":
        budget = f"up to {config.updates} updates, stopped by the first check above {config.stop_above}"
    else:
        budget = f"{config.updates} updates, keeping the last check at or below {config.stop_above}"
    print(f"SFT warm start ({budget}) -> {out}", flush=True)
    report = run_sft(config, args.state_dir / "sft")
    return out, float(report["sft_wall_s"]), report


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl demo", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="base model (the tiny model is built there if missing)")
    parser.add_argument("--env", choices=sorted(ENV_CONFIGS), default="maze",
                        help="the environment: picks the default --config, --sft-config and --out (default maze)")
    parser.add_argument("--sft-config", type=Path,
                        help="SFT config of the warm start (default: configs/sft-tiny.yaml for the maze, "
                             "configs/sft-sokoban-tiny.yaml for sokoban)")
    parser.add_argument("--sft-model", type=Path, help="start GRPO from this model directory instead of running SFT")
    parser.add_argument("--config", type=Path,
                        help="GRPO run config (default: configs/maze-tiny-cpu.yaml, configs/sokoban-tiny-cpu.yaml)")
    add_overrides(parser, "run config")
    parser.add_argument("--steps", type=int, help="GRPO steps (overrides the run config)")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl/demo"), help="models, logs, shared root")
    parser.add_argument("--out", type=Path, help="where the results go (default: outputs/demo, outputs/demo-sokoban)")
    parser.add_argument("--budget-min", type=float, default=30.0,
                        help="also report the last eval within this many minutes of GRPO (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    run_config, sft_config, out = ENV_CONFIGS[args.env]
    args.config = args.config or run_config
    args.sft_config = args.sft_config or sft_config
    args.out = args.out or out
    if args.budget_min <= 0:
        parser.error(f"--budget-min must be positive, got {args.budget_min}")

    if args.sft_model and not (args.sft_model / "config.json").is_file():
        parser.error(f"--sft-model {args.sft_model}: no config.json there")
    overrides = overrides_from(args)
    if args.steps is not None:
        overrides["steps"] = args.steps
    base = ensure_tiny_model(args.model)
    load_config_dict(args.config, {**overrides, "model": str(base.resolve())})  # refused now, not after the SFT
    sft_report: dict[str, Any]
    if args.sft_model:
        sft_model, sft_wall_s, sft_report = args.sft_model, 0.0, {}
    else:
        sft_model, sft_wall_s, sft_report = sft_checkpoint(args, base)
    overrides["model"] = str(sft_model.resolve())
    config = load_config_dict(args.config, overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "run_config.json", config)

    stack = Stack(StackConfig(model=sft_model.resolve(), state_dir=args.state_dir, lora_rank=config["lora"]["rank"],
                              resume_runs=False, env_name=args.env))
    with stack:
        stack.start()
        api = stack.client()
        stop_left_running(api)
        started = time.perf_counter()
        run = api.start(config)
        print(f"GRPO run {run['id']} started; watching (API {stack.api_url})", flush=True)
        final = watch_or_stop(api, run["id"])
        grpo_wall_s = time.perf_counter() - started
        evals = api.request("GET", f"/v1/runs/{run['id']}/evals")["evals"]
        metrics = api.request("GET", f"/v1/runs/{run['id']}/metrics")["metrics"]
        last_eval = evals[-1]["step"] if evals else 0
        episodes = api.request("GET", f"/v1/runs/{run['id']}/episodes",
                               params={"kind": "eval", "step": last_eval})["episodes"]
    curve = learning_curve(evals, metrics)
    write_json(args.out / "curve.json", curve)
    if evals:
        kind = "mazes" if args.env == "maze" else f"{args.env} levels"
        plot_curve(curve, args.out / "curve.png", f"GRPO from SFT, {evals[0]['episodes']} fixed eval {kind}")
    if final["state"] != "succeeded":
        # What the run measured is kept: the curve so far, and its adapters under the shared root.
        reason = f": {final['failure_reason']}" if final.get("failure_reason") else ""
        print(f"the run ended {final['state']} at step {final['step']}{reason}; "
              f"the curve so far ({len(evals)} evals) is in {args.out}/curve.json")
        if args.json:
            print(json.dumps({
                "state": final["state"], "interrupted": bool(final.get("interrupted")),
                "failure_reason": final.get("failure_reason", ""), "run_id": run["id"], "steps": final["step"],
                "start_solve_rate": evals[0]["greedy_solve_rate"] if evals else None,
                "last_solve_rate": evals[-1]["greedy_solve_rate"] if evals else None,
                "grpo_wall_s": round(grpo_wall_s, 1), "output_dir": str(args.out.resolve()),
            }))
        return 130 if final.get("interrupted") else 1
    last_step = evals[-1]["step"]
    within = last_eval_within(curve, args.budget_min * 60)
    solved = [e for e in episodes if e["step"] == last_step and e["solved"] and e["frames"]]
    strip = None
    if solved:
        best = max(solved, key=lambda e: len(e["frames"]))
        strip = args.out / "solved_episode.png"
        run_dir = stack.config.shared_root / "runs" / run["id"]  # frames are listed relative to it
        episode_strip([run_dir / f for f in best["frames"]], best["actions"], strip)
    final_adapter = stack.config.shared_root / "runs" / run["id"] / "adapters" / f"v{final['adapter_version']:06d}"
    summary = {
        "start_solve_rate": evals[0]["greedy_solve_rate"], "end_solve_rate": evals[-1]["greedy_solve_rate"],
        "start_sampled_solve_rate": evals[0].get("sampled_solve_rate"),
        "end_sampled_solve_rate": evals[-1].get("sampled_solve_rate"),
        "start_sampled_pass_rate": evals[0].get("sampled_pass_rate"),
        "end_sampled_pass_rate": evals[-1].get("sampled_pass_rate"),
        "sft_solve_rate": sft_report.get("eval", {}).get("greedy_solve_rate"),
        "sft_updates": sft_report.get("updates"), "sft_checks": sft_report.get("checks"),
        "budget_min": args.budget_min,
        "within_budget_step": within["step"] if within else None,
        "within_budget_solve_rate": within["greedy_solve_rate"] if within else None,
        "within_budget_grpo_s": round(within["grpo_s"], 1) if within else None,
        "steps": final["step"], "grpo_wall_s": round(grpo_wall_s, 1), "sft_wall_s": round(sft_wall_s, 1),
        "mean_step_s": round(sum(m.get("time/step_s", 0) for m in metrics) / max(len(metrics), 1), 2),
        "run_id": run["id"], "output_dir": str(args.out.resolve()), "model_dir": str(sft_model.resolve()),
        "final_adapter_dir": str(final_adapter.resolve()), "curve_png": str((args.out / "curve.png").resolve()),
        "solved_episode_png": str(strip.resolve()) if strip else None,
    }
    write_json(args.out / "summary.json", summary)
    tasks = "mazes" if args.env == "maze" else "levels"
    print(f"\neval solve rate (greedy, {evals[0]['episodes']} {tasks}): {summary['start_solve_rate']:.3f} at step 0"
          f" -> {summary['end_solve_rate']:.3f} at step {last_step}")
    if within:
        print(f"within {args.budget_min:g} min of GRPO: {within['greedy_solve_rate']:.3f} at step "
              f"{within['step']} ({within['grpo_s']:.0f} s of steps and evals)")
    print(f"GRPO {summary['grpo_wall_s']:.0f} s, SFT {summary['sft_wall_s']:.0f} s; outputs in {args.out}/ "
          "(curve.json, curve.png, solved_episode.png, summary.json)")
    if args.json:
        print(json.dumps(summary))
    return 0
