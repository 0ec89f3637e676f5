"""`mmrl run {start,list,status,watch,pause,resume,stop}`: runs through the coordinator's REST API."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

TERMINAL = {"succeeded", "failed", "stopped"}


class ApiClient:
    def __init__(self, url: str, token: str = "") -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SystemExit(f"cannot reach the coordinator at {self.http.base_url}: {exc}") from exc
        if reply.status_code >= 400:
            raise SystemExit(f"{method} {path} -> {reply.status_code}: {reply.text}")
        return reply.json()

    def start(self, config: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", "/v1/runs", json={"config": config}))

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/runs/{run_id}"))


def stop_left_running(api: ApiClient) -> None:
    """Marks stopped the runs an earlier demo or benchmark left pending or running (a second Ctrl-C
    leaves at once): a coordinator started without resuming runs does not drive them, and the
    learner takes one run at a time."""
    left = [run for state in ("pending", "running")
            for run in api.request("GET", "/v1/runs", params={"state": state, "limit": 1000})["runs"]]
    for run in left:
        if run["state"] in ("pending", "running"):
            api.request("POST", f"/v1/runs/{run['id']}/stop")
            print(f"run {run['id']} was left {run['state']} at step {run['step']} by an earlier job: "
                  "marked stopped", flush=True)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`--set grpo.group_size=4` -> {"grpo.group_size": 4} (values parsed as YAML scalars)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise SystemExit(f"--set {pair}: the value is not a YAML scalar or list ({exc})") from None
    return out


def load_config_dict(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    from services.coordinator.config import load_run_config

    try:
        config = load_run_config(path, overrides)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"invalid run config {path}: {exc}") from exc
    if Path(config.model).exists():  # a local directory: make it independent of the coordinator's cwd
        config.model = str(Path(config.model).resolve())
    return config.model_dump(mode="json")


def progress_line(run: dict[str, Any]) -> str:
    metrics = run.get("latest_metrics") or {}
    evaluation = run.get("latest_eval") or {}
    width = 24
    done = int(width * run["step"] / max(run["steps"], 1))
    bar = "#" * done + "-" * (width - done)
    parts = [f"[{bar}] step {run['step']}/{run['steps']}", run["state"]]
    if metrics:
        parts.append(f"reward {metrics.get('reward/mean', 0):.2f}")
        parts.append(f"step {metrics.get('time/step_s', 0):.1f}s")
    if evaluation:
        parts.append(f"eval@{evaluation['step']} greedy {evaluation['greedy_solve_rate']:.2f}")
    return "  ".join(parts)


def watch(api: ApiClient, run_id: str, interval_s: float = 1.0, out: Any = sys.stdout) -> dict[str, Any]:
    """Prints progress until the run ends or pauses; returns the final run record."""
    tty = out.isatty()
    last = ""
    while True:
        run = api.run(run_id)
        line = progress_line(run)
        if line != last:
            out.write(("\r" + line.ljust(110)) if tty else line + "\n")
            out.flush()
            last = line
        if run["state"] in TERMINAL or run["state"] == "paused":
            if tty:
                out.write("\n")
            if run["failure_reason"]:
                out.write(f"failure: {run['failure_reason']}\n")
            return run
        time.sleep(interval_s)


def watch_status(final: dict[str, Any]) -> int:
    """Exit status of a watch: 0 when the run succeeded or paused (it can be resumed), else 1."""
    return 0 if final["state"] in ("succeeded", "paused") else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl run", description=__doc__)
    parser.add_argument("--api", default=os.environ.get("MMRL_API_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("MMRL_API_TOKEN", ""))
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start a run; prints its id")
    start.add_argument("--config", type=Path, required=True)
    start.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    start.add_argument("--watch", action="store_true", help="then watch it")
    sub.add_parser("list", help="list runs")
    for action in ("status", "watch", "pause", "resume", "stop"):
        sub.add_parser(action).add_argument("run_id")
    args = parser.parse_args(argv)
    api = ApiClient(args.api, args.token)

    if args.action == "start":
        run = api.start(load_config_dict(args.config, parse_overrides(args.set)))
        print(run["id"])
        if args.watch:
            return watch_status(watch(api, run["id"]))
    elif args.action == "list":
        offset = 0
        while True:
            page = api.request("GET", "/v1/runs", params={"offset": offset, "limit": 1000})
            for run in page["runs"]:
                print(f"{run['id']:<48} {run['state']:<10} step {run['step']}/{run['steps']}")
            offset += len(page["runs"])
            if not page["runs"] or offset >= page["total"]:
                break
    elif args.action == "status":
        print(json.dumps(api.run(args.run_id), indent=2))
    elif args.action == "watch":
        return watch_status(watch(api, args.run_id))
    else:
        run = api.request("POST", f"/v1/runs/{args.run_id}/{args.action}")
        print(f"{run['id']}: {run['state']}{' (' + run['desired'] + ' requested)' if run.get('desired') else ''}")
    return 0
