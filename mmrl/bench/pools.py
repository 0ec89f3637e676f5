"""`mmrl bench pools`: two tiny GRPO runs on two learner pools that share one rollout replica, both
at once, against the same two runs one after the other.

One stack with two learner services (MMRL_LEARNER_ADDRS names both) and one rollout replica that
serves both runs' adapters. First the two runs are posted together: the scheduler starts each on its
own pool and both sample from the shared replica. Then the same two runs are posted one after the
other. Before either, a one-step run on each pool warms the services (first adapter loads, first
batches), and is not counted. Printed for each way: the total wall time and each run's mean step time; checked for every
run: it succeeded, each step recorded exactly once, its adapter versions consecutive with manifests
that verify (the replica probed each one on load, `adapter_probe: required`), and every episode
sampled with its own step's version. With --json the last line is one JSON object. Exit status 1
when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from mmrl.bench.faults import SMALL, Api, adapters_valid, sampled_as_meant, step_events, steps_exact
from mmrl.cli.options import add_overrides, overrides_from
from mmrl.cli.run import load_config_dict, stop_left_running
from mmrl.cli.stack import Stack, StackConfig
from mmrl.cli.up import DEFAULT_MODEL, ensure_tiny_model

ENDED = ("succeeded", "failed", "stopped")


def wait_ended(api: Api, run_ids: list[str], log: bool) -> tuple[list[dict[str, Any]], bool]:
    """Polls until every run has ended; the runs' last records, and whether all of them were
    running at the same moment at least once."""
    together = False
    shown: dict[str, int] = {}
    while True:
        runs = [api.get(f"/v1/runs/{run_id}") for run_id in run_ids]
        together = together or all(run["state"] == "running" for run in runs)
        if log:
            for run in runs:
                if shown.get(run["id"]) != run["step"]:
                    shown[run["id"]] = run["step"]
                    print(f"  {run['id']} on {run['learner'] or '-'}: step {run['step']}/{run['steps']} "
                          f"{run['state']}", flush=True)
        if all(run["state"] in ENDED for run in runs):
            return runs, together
        time.sleep(0.5)


def run_report(stack: Stack, api: Api, run: dict[str, Any]) -> dict[str, Any]:
    """One ended run: its pool, mean step time and the checks."""
    metrics = api.get(f"/v1/runs/{run['id']}/metrics")["metrics"]
    episodes = api.get(f"/v1/runs/{run['id']}/episodes", kind="train", limit=10_000)["episodes"]
    published = [m["adapter/published"] for m in metrics]
    step_s = [m["time/step_s"] for m in metrics]
    return {
        "run_id": run["id"], "learner": run["learner"], "state": run["state"],
        "failure_reason": run["failure_reason"], "steps": len(metrics),
        "step_s_mean": round(sum(step_s) / max(len(step_s), 1), 3),
        "steps_exact": steps_exact(metrics, step_events(stack, run["id"], stack.config.api_token)),
        "adapters_valid": adapters_valid(stack.config.shared_root, run["id"], published),
        "sampled_as_meant": sampled_as_meant(metrics, episodes),
    }


def play(stack: Stack, config: dict[str, Any], together: bool, log: bool) -> dict[str, Any]:
    """Two runs of `config`, posted at once (`together`) or the second after the first ended."""
    api, client = Api(stack), stack.client()
    started = time.perf_counter()
    ended: list[dict[str, Any]] = []
    overlapped = False
    if together:
        ids = [client.start(config)["id"] for _ in range(2)]
        ended, overlapped = wait_ended(api, ids, log)
    else:
        for _ in range(2):
            runs, _ = wait_ended(api, [client.start(config)["id"]], log)
            ended += runs
    wall_s = time.perf_counter() - started
    return {"wall_s": round(wall_s, 1), "overlapped": overlapped,
            "runs": [run_report(stack, api, run) for run in ended]}


def checks_hold(result: dict[str, Any]) -> bool:
    runs = result["runs"]
    return all(r["state"] == "succeeded" and r["steps_exact"] and r["adapters_valid"] and r["sampled_as_meant"]
               for r in runs)


def passed(shared: dict[str, Any], sequential: dict[str, Any]) -> bool:
    """Every run's checks hold, and the shared runs ran at once on two different pools."""
    pools = {r["learner"] for r in shared["runs"]}
    return checks_hold(shared) and checks_hold(sequential) and shared["overlapped"] and len(pools) == 2


def summary_lines(shared: dict[str, Any], sequential: dict[str, Any]) -> list[str]:
    lines = ["| way | wall (s) | run | pool | steps | mean step (s) | steps exact | adapters valid | "
             "sampled with own version |", "|---|---|---|---|---|---|---|---|---|"]
    for way, result in (("shared (at once)", shared), ("sequential", sequential)):
        for run in result["runs"]:
            lines.append(f"| {way} | {result['wall_s']} | {run['run_id']} | {run['learner']} | {run['steps']} | "
                         f"{run['step_s_mean']} | {run['steps_exact']} | {run['adapters_valid']} | "
                         f"{run['sampled_as_meant']} |")
    lines.append(f"shared / sequential wall time: {shared['wall_s'] / max(sequential['wall_s'], 1e-9):.2f}; "
                 f"the shared runs overlapped: {shared['overlapped']}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl bench pools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="base model (built there if missing)")
    parser.add_argument("--config", type=Path, default=Path("configs/maze-tiny-cpu.yaml"), help="GRPO run config")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of each run")
    add_overrides(parser, "run config")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl/bench-pools"), help="logs, Redis, shared root")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)

    model = ensure_tiny_model(args.model).resolve()
    overrides = {**SMALL, "steps": args.steps, "checkpoint_interval": 10_000, **overrides_from(args),
                 "model": str(model)}
    config = load_config_dict(args.config, overrides)
    stack_config = StackConfig(model=model, state_dir=args.state_dir, lora_rank=config["lora"]["rank"],
                               resume_runs=False, learner_pools=2)
    log = not args.json
    with Stack(stack_config) as stack:
        stack.start(log=log)
        stop_left_running(stack.client())
        if log:
            print("warming up: a one-step run on each pool", flush=True)
        play(stack, {**config, "steps": 1}, together=True, log=log)
        if log:
            print("two runs at once, one on each learner pool:", flush=True)
        shared = play(stack, config, together=True, log=log)
        if log:
            print("the same two runs one after the other:", flush=True)
        sequential = play(stack, config, together=False, log=log)
    ok = passed(shared, sequential)
    result = {"ok": ok, "shared": shared, "sequential": sequential,
              "wall_ratio_shared_to_sequential": round(shared["wall_s"] / max(sequential["wall_s"], 1e-9), 3)}
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(summary_lines(shared, sequential)))
    if not ok:
        print("a check failed (see the table)", file=sys.stderr)
    return 0 if ok else 1
