"""`mmrl bench e2e`: a few GRPO steps of the tiny config through every real service; reports the
mean step time and its parts (rollout, env, train, sync = publish + load, eval, overhead)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mmrl.cli.options import add_overrides, overrides_from
from mmrl.cli.run import load_config_dict, stop_left_running, watch
from mmrl.cli.stack import Stack, StackConfig
from mmrl.cli.up import DEFAULT_MODEL, ensure_tiny_model


def breakdown(metrics: list[dict], evals: list[dict]) -> dict[str, float]:
    """Mean per-step seconds; eval time is spread over the steps it served."""
    n = len(metrics)
    mean = {part: sum(m.get(f"time/{part}_s", 0.0) for m in metrics) / n
            for part in ("step", "rollout", "env", "train", "sync")}
    eval_s = sum(e.get("eval_s", 0.0) for e in evals) / n
    step_s = mean["step"] + eval_s
    parts = {"rollout_s": mean["rollout"], "env_s": mean["env"], "train_s": mean["train"],
             "sync_s": mean["sync"], "eval_s": eval_s}
    overhead = step_s - sum(parts.values())
    return {"step_s": step_s, **parts, "overhead_s": overhead, "overhead_fraction": overhead / step_s,
            "sync_fraction": mean["sync"] / step_s}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl bench e2e", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="base model (built there if missing)")
    parser.add_argument("--config", type=Path, default=Path("configs/maze-tiny-cpu.yaml"), help="GRPO run config")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps to time")
    add_overrides(parser, "run config")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl/bench-e2e"), help="models, logs, shared root")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)

    model = ensure_tiny_model(args.model)
    overrides = {"steps": args.steps, "eval.interval": 10_000, "eval.sampled_samples": 0,
                 "checkpoint_interval": 10_000, **overrides_from(args)}
    overrides["model"] = str(model.resolve())
    config = load_config_dict(args.config, overrides)
    stack_config = StackConfig(model=model.resolve(), state_dir=args.state_dir, lora_rank=config["lora"]["rank"],
                               resume_runs=False)  # an interrupted benchmark's run is not driven again
    with Stack(stack_config) as stack:
        stack.start(log=not args.json)
        api = stack.client()
        stop_left_running(api)
        started = time.perf_counter()
        run = api.start(config)
        final = watch(api, run["id"], interval_s=1.0)
        wall_s = time.perf_counter() - started
        metrics = api.request("GET", f"/v1/runs/{run['id']}/metrics")["metrics"]
        evals = api.request("GET", f"/v1/runs/{run['id']}/evals")["evals"]
    if final["state"] != "succeeded":
        print(f"bench run ended {final['state']}: {final['failure_reason']}", file=sys.stderr)
        if args.json:  # the last line is still one JSON object
            print(json.dumps({"state": final["state"], "failure_reason": final["failure_reason"],
                              "run_id": run["id"], "steps": len(metrics)}))
        return 1
    result = {**{k: round(v, 4) for k, v in breakdown(metrics, evals).items()},
              "steps": len(metrics), "run_wall_s": round(wall_s, 1),
              "episodes_per_step": metrics[0]["episodes/num"],
              "turns_per_episode": round(sum(m["episodes/turns_mean"] for m in metrics) / len(metrics), 2)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
