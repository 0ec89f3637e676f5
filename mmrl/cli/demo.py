"""`mmrl demo`: the main job. Builds the tiny model, runs (or reuses) the SFT warm start, starts the
stack, runs GRPO through the REST API with live progress, and writes the learning curve (JSON +
PNG), a solved eval episode as an image strip, and a summary with the machine it ran on. `--env NAME`
does the same on another registered environment with its own shipped configs
(configs/<env>-tiny-cpu.yaml, configs/sft-<env>-tiny.yaml) and output directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mmrl.cli.options import add_overrides, overrides_from
from mmrl.cli.run import load_config_dict
from mmrl.cli.up import DEFAULT_MODEL, ensure_tiny_model
from mmrl.demo.grpo import print_summary, run_grpo, stack_for
from mmrl.demo.starts import from_scratch, sft_checkpoint, shipped_configs
from mmrl.report.machine import machine_info
from mmrl.report.plots import write_json
from services.env import registry
from services.env.gym.presets import PRESETS


def add_common_options(parser: argparse.ArgumentParser, job: str) -> None:
    """The options `mmrl demo` and `mmrl sweep` share."""
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="base model (the tiny model is built there if missing)")
    parser.add_argument("--env", choices=(*registry.names(), *PRESETS), default="maze",
                        help="the environment, registered or a Gymnasium preset: picks the shipped --config and "
                             "--sft-config (default maze)")
    parser.add_argument("--sft-config", type=Path, help="SFT config of the warm start (default: "
                                                        "configs/sft-<env>-tiny.yaml; where none is shipped, "
                                                        "as for the Gymnasium presets, GRPO starts from the "
                                                        "base model)")
    parser.add_argument("--config", type=Path, help="GRPO run config (default: configs/<env>-tiny-cpu.yaml)")
    add_overrides(parser, "run config")
    parser.add_argument("--steps", type=int, help="GRPO steps (overrides the run config)")
    parser.add_argument("--state-dir", type=Path, default=Path(f".mmrl/{job}"), help="models, logs, shared root")
    parser.add_argument("--budget-min", type=float, default=30.0,
                        help="also report the last eval within this many minutes of GRPO (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def resolve_common(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """Fills the env's shipped configs in, checks the options and returns the run config overrides."""
    run_config, sft_config = shipped_configs(args.env)
    args.config = args.config or run_config
    args.sft_config = args.sft_config or (sft_config if sft_config.is_file() else None)  # None: no SFT
    if args.budget_min <= 0:
        parser.error(f"--budget-min must be positive, got {args.budget_min}")
    overrides = overrides_from(args)
    if args.steps is not None:
        overrides["steps"] = args.steps
    return overrides


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl demo", description=__doc__)
    add_common_options(parser, "demo")
    parser.add_argument("--sft-model", type=Path, help="start GRPO from this model directory instead of running SFT")
    parser.add_argument("--out", type=Path, help="where the results go (default: outputs/demo-<env>)")
    args = parser.parse_args(argv)
    overrides = resolve_common(parser, args)
    out = args.out or Path(f"outputs/demo-{args.env}")
    if args.sft_model and not (args.sft_model / "config.json").is_file():
        parser.error(f"--sft-model {args.sft_model}: no config.json there")
    base = ensure_tiny_model(args.model)
    load_config_dict(args.config, {**overrides, "model": str(base.resolve())})  # refused now, not after the SFT
    sft_report: dict[str, Any]
    if args.sft_model:
        sft_model, sft_wall_s, sft_report = args.sft_model, 0.0, {}
    elif args.sft_config is None:
        sft_model, sft_wall_s, sft_report = from_scratch(args.env, base), 0.0, {}
    else:
        sft_model, sft_wall_s, sft_report = sft_checkpoint(args.sft_config, args.state_dir, args.env, base)
    config = load_config_dict(args.config, {**overrides, "model": str(sft_model.resolve())})

    with stack_for(sft_model, config, args.state_dir, args.env) as (api, shared_root):
        summary = run_grpo(api, config, out, shared_root, args.budget_min, f"GRPO from SFT ({args.env})")
    summary.update({
        "env": args.env, "sft_solve_rate": sft_report.get("eval", {}).get("greedy_solve_rate"),
        "chance_solve_rate": sft_report.get("chance", {}).get("chance_solve_rate"),
        "sft_updates": sft_report.get("updates"), "sft_checks": sft_report.get("checks"),
        "sft_wall_s": round(sft_wall_s, 1), "model_dir": str(sft_model.resolve()), "machine": machine_info(),
    })
    write_json(out / "summary.json", summary)
    print_summary(summary, args.budget_min)
    print(f"GRPO {summary['grpo_wall_s']:.0f} s, SFT {summary['sft_wall_s']:.0f} s; outputs in {out}/")
    if args.json:
        print(json.dumps(summary))
    if summary["state"] != "succeeded":
        return 130 if summary["interrupted"] else 1
    return 0
