"""`mmrl sweep`: the demo's GRPO stage K times, one run after another: every seed of `--seeds` from
every SFT start (`--sft-model DIR`, repeatable; default the demo's own SFT checkpoint, trained or
reused as `mmrl demo` does). Each run writes what a demo writes under `<out>/<start>-seed<k>/`; the
sweep writes `sweep.json` (per eval step the worst, mean and best greedy solve rate; per figure of a
run, such as its end, its last eval within the time budget and that eval's gain over the start, its
spread over the runs, overall and per start; the machine) and `band.png`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mmrl.cli.demo import add_common_options, resolve_common
from mmrl.cli.run import load_config_dict
from mmrl.cli.up import ensure_tiny_model
from mmrl.demo.aggregate import aggregate, figure_lines, write_sweep
from mmrl.demo.grpo import print_summary, run_grpo, stack_for
from mmrl.demo.starts import from_scratch, sft_checkpoint
from mmrl.report.machine import machine_info
from mmrl.report.plots import write_json


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise SystemExit(f"--seeds expects comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise SystemExit(f"--seeds expects distinct integers >= 0, got {text!r}")
    return seeds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl sweep", description=__doc__)
    add_common_options(parser, "sweep")
    parser.add_argument("--sft-model", type=Path, action="append", default=[],
                        help="an SFT start to run from (repeat for several; default: the demo's SFT)")
    parser.add_argument("--seeds", default="0,1,2", help="run seeds, comma-separated (default 0,1,2)")
    parser.add_argument("--out", type=Path, help="where the results go (default: outputs/sweep-<env>)")
    args = parser.parse_args(argv)
    overrides = resolve_common(parser, args)
    seeds = parse_seeds(args.seeds)
    out = args.out or Path(f"outputs/sweep-{args.env}")
    for start in args.sft_model:
        if not (start / "config.json").is_file():
            parser.error(f"--sft-model {start}: no config.json there")
    base = ensure_tiny_model(args.model)
    load_config_dict(args.config, {**overrides, "model": str(base.resolve())})  # refused now, not after the SFT
    starts = list(args.sft_model)
    if not starts:
        starts = [from_scratch(args.env, base) if args.sft_config is None
                  else sft_checkpoint(args.sft_config, Path(".mmrl/demo"), args.env, base)[0]]

    summaries: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    machine = machine_info()
    for start in starts:
        config = load_config_dict(args.config, {**overrides, "model": str(start.resolve())})
        with stack_for(start, config, args.state_dir, args.env) as (api, shared_root):
            for seed in seeds:
                run_out = out / f"{start.name}-seed{seed}"
                print(f"\n== sweep run: start {start}, seed {seed} -> {run_out}", flush=True)
                summary = run_grpo(api, {**config, "seed": seed}, run_out, shared_root, args.budget_min,
                                   f"GRPO from {start.name}, seed {seed}")
                summary.update({"start": str(start), "machine": machine})
                write_json(run_out / "summary.json", summary)
                print_summary(summary, args.budget_min)
                summaries.append(summary)
                curves.append(json.loads((run_out / "curve.json").read_text()))
                if summary["interrupted"]:
                    break
        if summaries and summaries[-1]["interrupted"]:
            break

    result = {**aggregate(summaries, curves), "env": args.env, "seeds": seeds, "starts": [str(s) for s in starts],
              "budget_min": args.budget_min, "machine": machine,
              "command": "mmrl sweep " + " ".join(argv)}
    write_sweep(out, result, summaries, curves)
    for line in figure_lines(result["figures"]):
        print(line)
    print(f"sweep results in {out}/ (sweep.json, band.png)")
    if args.json:
        print(json.dumps(result))
    return 0 if result["num_succeeded"] == len(summaries) else 1
