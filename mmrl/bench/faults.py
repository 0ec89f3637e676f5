"""`mmrl bench faults`: fault injection on one tiny GRPO run through every real service.

One stack, one run: each service in turn (env, rollout, learner, coordinator, Redis) has its whole
process group SIGKILLed in the middle of a step and is started again at once on the same address,
as a supervisor would; the next kill waits until the run has recovered (recorded a step after the
kill). Printed: a table (service killed, step it was killed in, seconds until the run recorded its
next step, steps recorded exactly once, adapter versions consecutive with valid manifests) and,
with --json, one JSON object as the last line. Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from mmrl.cli.options import add_overrides, overrides_from
from mmrl.cli.run import load_config_dict
from mmrl.cli.stack import Stack, StackConfig
from mmrl.cli.up import DEFAULT_MODEL, ensure_tiny_model
from services.common import storage
from services.common.user_errors import UsageError

KILL_ORDER = ("env", "rollout", "learner", "coordinator", "redis")
SMALL = {"grpo.group_size": 2, "grpo.tasks_per_step": 2, "grpo.group_sampling": "plain", "grpo.max_sampling_rounds": None, "env.max_moves": 6,
         "eval.max_tasks": 2, "eval.sampled_samples": 0, "eval.interval": 1000, "optim.micro_batch_size": 4,
         "sampling.max_tokens": 3, "checkpoint_interval": 1}


class Api:
    """REST calls that ride out a coordinator or Redis that is down (connection errors, 503)."""

    def __init__(self, stack: Stack) -> None:
        headers = {"Authorization": f"Bearer {stack.config.api_token}"} if stack.config.api_token else {}
        self.http = httpx.Client(base_url=stack.api_url, headers=headers, timeout=30)

    def get(self, path: str, timeout_s: float = 900.0, **params: Any) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self.http.get(path, params=params)
                if reply.status_code < 500:
                    reply.raise_for_status()
                    return reply.json()
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"GET {path} did not answer within {timeout_s:.0f} s")
            time.sleep(0.5)


def adapters_valid(shared_root: Path, run_id: str, published: list[int]) -> bool:
    """Versions 1..newest all on storage, each with a manifest that verifies, and the metrics'
    published versions increasing."""
    versions = [v for v, _ in storage.list_adapter_versions(shared_root, run_id)]
    if not published or versions != list(range(1, max(versions, default=0) + 1)):
        return False
    if published != sorted(set(published)) or published[-1] > versions[-1]:
        return False
    try:
        for _, directory in storage.list_adapter_versions(shared_root, run_id):
            storage.verify_manifest(directory)
    except (storage.ManifestError, OSError):
        return False
    return True


def steps_exact(metrics: list[dict[str, Any]], events: list[int]) -> bool:
    """Steps 1..n recorded once each, announced once each in the event stream."""
    steps = [m["step"] for m in metrics]
    return steps == list(range(1, len(steps) + 1)) and events == steps


def sampled_as_meant(metrics: list[dict[str, Any]], episodes: list[dict[str, Any]]) -> bool:
    """Every step sampled with the version its predecessor published (0 for step 1) or, when the
    step was redone, the version republished from the checkpoint it was redone from: at least the
    predecessor's and older than its own; and every episode recorded with its step's version."""
    previous = 0
    for m in metrics:
        if not previous <= m["adapter/sampled_with"] < m["adapter/published"]:
            return False
        previous = m["adapter/published"]
    by_step = {m["step"]: m["adapter/sampled_with"] for m in metrics}
    return all(e["adapter_version"] == by_step[e["step"]] for e in episodes if e["step"] in by_step)


def step_events(stack: Stack, run_id: str, token: str) -> list[int]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = httpx.get(f"{stack.api_url}/v1/runs/{run_id}/events", params={"follow": False}, headers=headers,
                     timeout=60).text
    steps = []
    for block in text.split("\n\n"):
        if "event: step" in block:
            data = next(line[6:] for line in block.splitlines() if line.startswith("data: "))
            steps.append(int(json.loads(data)["step"]))
    return steps


def run_faults(stack: Stack, config: dict[str, Any], kills: tuple[str, ...], mid_step_s: float,
               log: bool) -> dict[str, Any]:
    api = Api(stack)
    token = stack.config.api_token
    reply = httpx.post(f"{stack.api_url}/v1/runs", json={"config": config}, timeout=60,
                       headers={"Authorization": f"Bearer {token}"} if token else {})
    reply.raise_for_status()
    run_id = reply.json()["id"]
    rows = []
    for index, service in enumerate(kills):
        target = 2 + 2 * index  # killed during step target + 1
        while (run := api.get(f"/v1/runs/{run_id}"))["step"] < target:
            if run["state"] in ("failed", "stopped", "succeeded"):
                break
            time.sleep(0.2)
        if run["state"] != "running":
            break
        time.sleep(mid_step_s)  # into the next step (its episodes are being played)
        killed_at = api.get(f"/v1/runs/{run_id}")["step"]
        started = time.monotonic()
        stack.kill(service)
        stack.start_again(service)
        restarted_s = time.monotonic() - started
        while (run := api.get(f"/v1/runs/{run_id}"))["step"] <= killed_at and run["state"] == "running":
            time.sleep(0.2)
        recovered_s = time.monotonic() - started
        metrics = api.get(f"/v1/runs/{run_id}/metrics")["metrics"]
        published = [m["adapter/published"] for m in metrics]
        row = {"service": service, "killed_in_step": killed_at + 1, "restarted_s": round(restarted_s, 1),
               "recovered_s": round(recovered_s, 1), "state": run["state"],
               "steps_exact": steps_exact(metrics, step_events(stack, run_id, token)),
               "adapters_valid": adapters_valid(stack.config.shared_root, run_id, published)}
        rows.append(row)
        if log:
            print(json.dumps(row), flush=True)
        if run["state"] != "running":
            break
    while (run := api.get(f"/v1/runs/{run_id}"))["state"] in ("pending", "running"):
        time.sleep(0.5)
    metrics = api.get(f"/v1/runs/{run_id}/metrics")["metrics"]
    episodes = api.get(f"/v1/runs/{run_id}/episodes", kind="train", limit=10_000)["episodes"]
    published = [m["adapter/published"] for m in metrics]
    events = httpx.get(f"{stack.api_url}/v1/runs/{run_id}/events", params={"follow": False}, timeout=60,
                       headers={"Authorization": f"Bearer {token}"} if token else {}).text
    return {"run_id": run_id, "state": run["state"], "failure_reason": run["failure_reason"],
            "steps": len(metrics), "kills": rows, "restarts": events.count("event: restart\n"),
            "steps_exact": steps_exact(metrics, step_events(stack, run_id, token)),
            "adapters_valid": adapters_valid(stack.config.shared_root, run_id, published),
            "sampled_as_meant": sampled_as_meant(metrics, episodes)}


def table(result: dict[str, Any]) -> str:
    lines = ["| service killed | killed in step | restarted after (s) | recovered after (s) | steps exact | "
             "adapters valid |", "|---|---|---|---|---|---|"]
    for row in result["kills"]:
        lines.append(f"| {row['service']} | {row['killed_in_step']} | {row['restarted_s']} | {row['recovered_s']} "
                     f"| {'yes' if row['steps_exact'] else 'NO'} | {'yes' if row['adapters_valid'] else 'NO'} |")
    lines.append(f"run {result['state']} after {result['steps']} steps, {result['restarts']} redos; steps exact: "
                 f"{result['steps_exact']}, adapters valid: {result['adapters_valid']}, every episode sampled "
                 f"with its step's adapter: {result['sampled_as_meant']}")
    return "\n".join(lines)


def passed(result: dict[str, Any], kills: tuple[str, ...]) -> bool:
    return (result["state"] == "succeeded" and len(result["kills"]) == len(kills) and result["steps_exact"]
            and result["adapters_valid"] and result["sampled_as_meant"]
            and all(r["steps_exact"] and r["adapters_valid"] for r in result["kills"]))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl bench faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="base model (built if missing)")
    parser.add_argument("--config", type=Path, default=Path("configs/maze-tiny-cpu.yaml"), help="run config")
    parser.add_argument("--kill", default=",".join(KILL_ORDER), help="services to kill, in order")
    parser.add_argument("--mid-step-s", type=float, default=1.0, help="seconds into a step to kill")
    add_overrides(parser, "run config")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a fresh temporary directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)

    kills = tuple(k.strip() for k in args.kill.split(",") if k.strip())
    unknown = set(kills) - set(KILL_ORDER)
    if unknown:
        raise UsageError(f"--kill: unknown services {sorted(unknown)} (use {', '.join(KILL_ORDER)})")
    model = ensure_tiny_model(args.model).resolve()
    overrides = {**SMALL, "steps": 2 * len(kills) + 4, **overrides_from(args), "model": str(model)}
    config = load_config_dict(args.config, overrides)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="mmrl-faults-"))
    stack_config = StackConfig(model=model, state_dir=state_dir, lora_rank=config["lora"]["rank"])
    started = time.monotonic()
    with Stack(stack_config) as stack:
        stack.start(log=not args.json)
        result = run_faults(stack, config, kills, args.mid_step_s, log=not args.json)
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["passed"] = passed(result, kills)
    print(table(result), flush=True)
    if args.json:
        print(json.dumps(result))
    elif not result["passed"]:
        print(f"FAILED: {result['failure_reason'] or 'see the table'}", file=sys.stderr)
    return 0 if result["passed"] else 1
