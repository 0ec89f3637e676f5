"""`mmrl sweep merge DIR [DIR ...] --out DIR`: finished sweeps as one distribution.

A sweep of 3 seeds from 2 starts is six GRPO runs, hours on 2 cores, so it is often run in parts:
one start today, another tomorrow, a seed that was missing later. Every run of a sweep keeps its
`summary.json` and `curve.json` in `<sweep out>/<start>-seed<k>/`; this command reads the runs of
every DIR given and writes what `mmrl sweep` writes (`sweep.json`, `band.png`) for all of them.

Runs are merged only when they measure the same thing, so each of these is refused with the
difference named: runs whose run configs differ in anything but the seed, the start (`model`) and
the service endpoints (a setting one run's config lacks, recorded before the setting existed,
counts at its default); runs from different machines (CPU model, kernel flags, torch version and
threads: float sums differ between them); two runs of the same start and seed; runs with different
time budgets. Commits may differ (the machine's `commit` then lists them); the merged sweep's
`command` names the commands of its parts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mmrl.demo.aggregate import aggregate, figure_lines, write_sweep
from services.common.config_files import flatten_settings
from services.common.user_errors import UsageError
from services.coordinator.config import RunConfig

# Run config keys that may differ between the runs of one sweep.
PER_RUN_KEYS = ("seed", "model", "endpoints")
# Machine keys that must agree (float sums differ between them); the commit may differ.
MACHINE_KEYS = ("cpu", "cpus", "cpu_flags", "torch", "torch_threads")


def find_runs(sweep_dir: Path) -> list[Path]:
    """The run directories of a sweep's output: its subdirectories with a summary and a curve."""
    if not sweep_dir.is_dir():
        raise UsageError(f"{sweep_dir}: not a directory")
    runs = sorted(d for d in sweep_dir.iterdir() if (d / "summary.json").is_file() and (d / "curve.json").is_file())
    if not runs:
        raise UsageError(f"{sweep_dir}: no runs in it (no <run>/summary.json with a curve.json beside it)")
    return runs


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The run config with every setting it lacks at its default: a run recorded before a setting
    existed ran what the setting's default runs. A config the current settings refuse (a setting
    since removed) is compared as recorded, so the difference is named."""
    try:
        return RunConfig.model_validate(config).model_dump(mode="json")
    except ValidationError:
        return config


def _compared_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The run config's settings as dotted keys, defaults filled in, the per-run keys left out."""
    return {k: v for k, v in flatten_settings(with_defaults(config)).items() if k.split(".")[0] not in PER_RUN_KEYS}


def config_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """`key: A vs B` for every setting two run configs differ in, the per-run keys left out."""
    flat_a, flat_b = _compared_settings(a), _compared_settings(b)
    return [f"{key}: {flat_a.get(key)!r} vs {flat_b.get(key)!r}" for key in sorted(set(flat_a) | set(flat_b))
            if flat_a.get(key) != flat_b.get(key)]


def machine_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [f"{key}: {a.get(key)!r} vs {b.get(key)!r}" for key in MACHINE_KEYS if a.get(key) != b.get(key)]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UsageError(f"{path}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a JSON object")
    return data


def merge(sweep_dirs: list[Path], command: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(sweep.json's content, the runs' summaries, their curves) for the runs of `sweep_dirs`; a
    mismatch (module docstring) raises UsageError naming it."""
    if not sweep_dirs:
        raise UsageError("name at least one sweep directory")
    summaries: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    first: tuple[Path, dict[str, Any], dict[str, Any]] | None = None  # (run dir, config, summary)
    seen: dict[tuple[str, Any], Path] = {}
    part_commands: list[str] = []
    envs: set[str] = set()
    for sweep_dir in sweep_dirs:
        sweep_file = sweep_dir / "sweep.json"
        part = _read_json(sweep_file) if sweep_file.is_file() else {}
        part_commands.append(str(part.get("command") or f"(runs in {sweep_dir})"))
        if part.get("env"):
            envs.add(str(part["env"]))
        for run_dir in find_runs(sweep_dir):
            summary = _read_json(run_dir / "summary.json")
            config_file = run_dir / "run_config.json"
            if not config_file.is_file():
                raise UsageError(f"{run_dir}: no run_config.json, so its settings cannot be compared")
            config = _read_json(config_file)
            key = (str(summary.get("start", "")), summary.get("seed"))
            if key in seen:
                raise UsageError(f"start {Path(key[0]).name} seed {key[1]} is in both {seen[key]} and {run_dir}")
            seen[key] = run_dir
            if first is None:
                first = (run_dir, config, summary)
            else:
                where = f"{first[0]} and {run_dir}"
                if differences := config_differences(first[1], config):
                    raise UsageError(f"{where} ran different settings: {'; '.join(differences)}")
                if differences := machine_differences(first[2].get("machine") or {}, summary.get("machine") or {}):
                    raise UsageError(f"{where} ran on different machines: {'; '.join(differences)}")
                if first[2].get("budget_min") != summary.get("budget_min"):
                    raise UsageError(f"{where} have different time budgets: {first[2].get('budget_min')} vs "
                                     f"{summary.get('budget_min')} minutes")
            summaries.append(summary)
            curves.append(_read_json(run_dir / "curve.json"))
    assert first is not None  # find_runs refuses a directory without runs
    if len(envs) > 1:
        raise UsageError(f"the sweeps are of different environments: {', '.join(sorted(envs))}")
    env = envs.pop() if envs else str(first[1].get("env", {}).get("name", ""))
    commits = list(dict.fromkeys(str((s.get("machine") or {}).get("commit")) for s in summaries))
    machine = {**(first[2].get("machine") or {}), "commit": ", ".join(commits)}
    starts = list(dict.fromkeys(str(s.get("start", "")) for s in summaries))
    result = {**aggregate(summaries, curves), "env": env,
              "seeds": sorted({int(s["seed"]) for s in summaries if s.get("seed") is not None}),
              "starts": starts, "budget_min": first[2].get("budget_min"), "machine": machine,
              "command": " ; ".join([*part_commands, command]), "merged_from": [str(d) for d in sweep_dirs]}
    return result, summaries, curves


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl sweep merge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", type=Path, nargs="+", help="the output directories of finished sweeps")
    parser.add_argument("--out", type=Path, required=True, help="where sweep.json and band.png go")
    parser.add_argument("--json", action="store_true", help="print sweep.json as the last line")
    args = parser.parse_args(argv)
    result, summaries, curves = merge(args.sweeps, "mmrl sweep merge " + " ".join(argv))
    args.out.mkdir(parents=True, exist_ok=True)
    write_sweep(args.out, result, summaries, curves)
    for start, figures in result["by_start"].items():
        for line in figure_lines(figures):
            print(f"{Path(start).name} {line}")
    print(f"{result['num_runs']} runs from {len(args.sweeps)} sweeps merged into {args.out}/ (sweep.json, band.png)")
    if args.json:
        print(json.dumps(result))
    return 0
