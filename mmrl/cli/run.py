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

from mmrl.cli.options import add_overrides, list_actions_in_help, overrides_from
from services.common.config_files import load_model_file
from services.common.messages import summary
from services.common.user_errors import CommandFailed

TERMINAL = {"succeeded", "failed", "stopped"}


class ApiClient:
    def __init__(self, url: str, token: str = "") -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            reply = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CommandFailed(f"cannot reach the coordinator at {self.http.base_url}: {exc} "
                                "(is it running? --api or MMRL_API_URL says where)") from None
        if reply.status_code >= 400:
            raise CommandFailed(f"{method} {path} -> {reply.status_code}: {reply.text}")
        return reply.json()

    def start(self, config: dict[str, Any], priority: int | None = None) -> dict[str, Any]:
        """Queues the run (it starts when a learner pool is free); `priority` overrides the config's."""
        body = {"config": config, **({"priority": priority} if priority is not None else {})}
        return dict(self.request("POST", "/v1/runs", json=body))

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/runs/{run_id}"))


def stop_left_running(api: ApiClient) -> None:
    """Marks stopped the runs an earlier demo or benchmark left queued, pending or running (a second
    Ctrl-C leaves at once): a coordinator started without resuming runs does not drive them, and a
    queued one would take a learner pool before the new run."""
    left = [run for state in ("queued", "pending", "running")
            for run in api.request("GET", "/v1/runs", params={"state": state, "limit": 1000})["runs"]]
    for run in left:
        if run["state"] in ("queued", "pending", "running"):
            api.request("POST", f"/v1/runs/{run['id']}/stop")
            print(f"run {run['id']} was left {run['state']} at step {run['step']} by an earlier job: "
                  "marked stopped", flush=True)


def load_config_dict(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The run config at `path` with `overrides`, validated, as JSON for `POST /v1/runs`; UsageError
    naming the file and the settings that are wrong."""
    from services.coordinator.config import RunConfig

    config = load_model_file(RunConfig, path, overrides)
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


def plot_run(api: ApiClient, run_id: str, out: Path) -> Path:
    """Writes the run's learning curve as `out` (PNG) and `out` with suffix .json; returns `out`."""
    from mmrl.report.plots import learning_curve, plot_curve, write_json

    run = api.run(run_id)
    evals = api.request("GET", f"/v1/runs/{run_id}/evals")["evals"]
    metrics = api.request("GET", f"/v1/runs/{run_id}/metrics")["metrics"]
    if not evals and not metrics:
        raise CommandFailed(f"run {run_id} has recorded no step or eval yet")
    curve = learning_curve(evals, metrics)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_curve(curve, out, f"{run['name']} ({run_id}), step {run['step']}/{run['steps']}")
    write_json(out.with_suffix(".json"), curve)
    return out


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl run", description=summary(__doc__))
    api = argparse.ArgumentParser(add_help=False)  # the coordinator's address, before or after the action
    for options, url, token in ((parser, os.environ.get("MMRL_API_URL", "http://127.0.0.1:8000"),
                                 os.environ.get("MMRL_API_TOKEN", "")), (api, argparse.SUPPRESS, argparse.SUPPRESS)):
        options.add_argument("--api", default=url, help="coordinator URL (MMRL_API_URL; default http://127.0.0.1:8000)")
        options.add_argument("--token", default=token, help="API bearer token (MMRL_API_TOKEN; default none)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", parents=[api], help="start a run from a run config; prints its id",
                               description="Start a run from a run config; prints its id.")
    start.add_argument("--config", type=Path, required=True, help="run config YAML (e.g. configs/maze-tiny-cpu.yaml)")
    add_overrides(start, "run config")
    start.add_argument("--priority", type=int, help="its place in the run queue while every learner pool is busy "
                                                   "(higher starts first; default: the config's priority)")
    start.add_argument("--watch", action="store_true", help="then watch it until it ends or pauses")
    actions.add_parser("list", parents=[api], help="list runs", description="List runs: id, state, step.")
    for action, what in (("status", "print a run's record as JSON"),
                         ("watch", "show a run's progress until it ends or pauses (exit 0: succeeded or paused)"),
                         ("pause", "pause a run at its next step boundary (resume continues it)"),
                         ("resume", "resume a paused run"), ("stop", "stop a run for good")):
        sub = actions.add_parser(action, parents=[api], help=what, description=what[0].upper() + what[1:] + ".")
        sub.add_argument("run_id", help="the run's id (`mmrl run list`)")
    plot = actions.add_parser("plot", parents=[api], help="draw a run's learning curve (eval solve rates, reward)",
                              description="Draw a run's learning curve (eval solve rates, training reward).")
    plot.add_argument("run_id", help="the run's id (`mmrl run list`)")
    plot.add_argument("--out", type=Path, help="PNG to write (default <run id>.png); its JSON goes beside it")
    list_actions_in_help(parser, actions)
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    api = ApiClient(args.api, args.token)

    if args.action == "start":
        run = api.start(load_config_dict(args.config, overrides_from(args)), args.priority)
        print(run["id"])
        if args.watch:
            return watch_status(watch(api, run["id"]))
    elif args.action == "list":
        offset = 0
        while True:
            page = api.request("GET", "/v1/runs", params={"offset": offset, "limit": 1000})
            for run in page["runs"]:
                place = f" (#{run['queue_position']} in the queue)" if run.get("queue_position") else ""
                print(f"{run['id']:<48} {run['state']:<10} step {run['step']}/{run['steps']}{place}")
            offset += len(page["runs"])
            if not page["runs"] or offset >= page["total"]:
                break
    elif args.action == "status":
        print(json.dumps(api.run(args.run_id), indent=2))
    elif args.action == "watch":
        return watch_status(watch(api, args.run_id))
    elif args.action == "plot":
        print(plot_run(api, args.run_id, args.out or Path(f"{args.run_id}.png")))
    else:
        run = api.request("POST", f"/v1/runs/{args.run_id}/{args.action}")
        print(f"{run['id']}: {run['state']}{' (' + run['desired'] + ' requested)' if run.get('desired') else ''}")
    return 0
