"""`mmrl report`: write docs/results.md (and the results table of README.md) from a demo's
`summary.json` and `curve.json` and from sweeps' `sweep.json`, so that a new run changes data, not
prose. A sweep (`mmrl sweep`) is the distribution over seeds and SFT starts; where the record holds
one, the README's table shows its worst, mean and best instead of one run's figures.

The data of record lives in docs/results/ (summary.json, curve.json, sweep-<env>.json). `--update`
copies a demo's files there (and its curve.png / solved_episode.png into docs/images/) before
rendering, `--sweep FILE` a sweep's (and its band.png); `--check` exits 1 when docs/results.md or
README.md's table is not what the record renders to.

Besides what `mmrl demo` writes, summary.json may carry `held_out_mazes`,
`held_out_start_solve_rate`, `held_out_end_solve_rate`, `machine`, `commit` and `command`
(`--update` sets them from its options); every optional field may be missing, and its row or
phrase is then left out."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmrl.report.machine import describe, machine_info

RECORD_DIR = Path("docs/results")
IMAGES = {"curve.png": "demo-curve.png", "solved_episode.png": "demo-solved-episode.png"}
README_BEGIN = "<!-- results:begin (mmrl report writes this table) -->"
README_END = "<!-- results:end -->"
# The SFT checks' series the page lists where every check has them: (label, key in a check).
CHECK_SERIES = (("", "validation_solve_rate"), ("sampled: ", "validation_sampled_rate"),
                ("greedy failed in a loop: ", "validation_loops"))


def _rate(value: Any) -> str:
    return "-" if value is None else f"{float(value):.3f}"


def _seconds(value: Any) -> str:
    return f"{float(value):,.0f} s"


def _from_to(start: Any, end: Any) -> str | None:
    return None if start is None or end is None else f"{_rate(start)} -> {_rate(end)}"


def result_rows(summary: dict[str, Any], curve: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, value) rows of the results table; a row whose fields are missing is left out."""
    evals = curve.get("eval") or []
    rows: list[tuple[str, str]] = []
    start = summary.get("sft_solve_rate", summary.get("start_solve_rate"))
    if start is not None:
        how = [f"{summary['sft_updates']} updates"] if summary.get("sft_updates") else []
        if summary.get("sft_wall_s"):
            how.append(_seconds(summary["sft_wall_s"]))
        rows.append(("SFT start, greedy solve rate", _rate(start) + (f" ({', '.join(how)})" if how else "")))
    if summary.get("chance_solve_rate") is not None:
        rows.append(("A uniform random policy (chance), sampled", _rate(summary["chance_solve_rate"])))
    if summary.get("within_budget_solve_rate") is not None:
        budget = _budget(summary)
        where = [f"step {summary['within_budget_step']}"] if summary.get("within_budget_step") is not None else []
        if summary.get("within_budget_grpo_s") is not None:
            where.append(f"{_seconds(summary['within_budget_grpo_s'])} of GRPO steps and evals")
        rows.append((f"GRPO within {budget} minutes, greedy",
                     _rate(summary["within_budget_solve_rate"]) + (f" ({', '.join(where)})" if where else "")))
    end = summary.get("end_solve_rate", evals[-1]["greedy_solve_rate"] if evals else None)
    if end is not None:
        where = [f"step {evals[-1]['step']}"] if evals else []
        if summary.get("grpo_wall_s"):
            where.append(f"{_seconds(summary['grpo_wall_s'])} of GRPO")
        rows.append(("GRPO at the end, greedy", _rate(end) + (f" ({', '.join(where)})" if where else "")))
    if summary.get("end_solve_rate_last3") is not None:
        rows.append(("GRPO at the end, mean of the last 3 evals, greedy", _rate(summary["end_solve_rate_last3"])))
    sampled = _from_to(summary.get("start_sampled_solve_rate"), summary.get("end_sampled_solve_rate"))
    if sampled:
        rows.append(("sampled solve rate, start -> end", sampled))
    held_out = _from_to(summary.get("held_out_start_solve_rate"),
                        summary.get("held_out_end_solve_rate", summary.get("held_out_solve_rate")))
    if held_out:
        mazes = summary.get("held_out_mazes")
        rows.append((f"held out{f' ({mazes} mazes never trained on)' if mazes else ''}, start -> end", held_out))
    if summary.get("mean_step_s"):
        rows.append(("time per GRPO step (mean)", f"{float(summary['mean_step_s']):.1f} s"))
    if summary.get("machine"):
        rows.append(("machine", machine_text(summary["machine"])))
    return rows


def machine_text(machine: Any) -> str:
    return describe(machine) if isinstance(machine, dict) else str(machine)


def _spread(figure: dict[str, Any] | None, signed: bool = False) -> str | None:
    if not figure:
        return None
    text = (lambda v: f"{v:+.3f}") if signed else _rate  # a gain carries its sign
    return f"{text(figure['worst'])} / {text(figure['mean'])} / {text(figure['best'])} ({figure['num']} runs)"


def _budget(record: dict[str, Any]) -> str:
    """The minutes of a demo's or sweep's "within the budget" figure, as the page writes them."""
    return f"{float(record.get('budget_min', 30)):g}"


def sweep_rows(sweep: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, worst / mean / best) rows of a sweep; a figure no run has is left out."""
    figures = sweep.get("figures", {})
    steps = max((r.get("steps") or 0 for r in sweep.get("runs", [])), default=0)
    budget = _budget(sweep)
    named = [("start (step 0), greedy", "start_solve_rate"),
             (f"end (step {steps}, mean of the last 3 evals), greedy", "end_solve_rate_last3"),
             (f"last eval within {budget} minutes of GRPO, greedy", "within_budget_solve_rate"),
             ("held out at the start, greedy", "held_out_start_solve_rate"),
             ("held out at the end, greedy", "held_out_solve_rate"),
             (f"gain within {budget} minutes (its last eval less the start)", "within_budget_gain"),
             ("gain held out (the end less the start)", "held_out_gain")]
    rows = [(what, text) for what, key in named if (text := _spread(figures.get(key), signed=key.endswith("gain")))]
    if sweep.get("mean_step_s"):
        rows.append(("time per GRPO step (mean over runs)", f"{float(sweep['mean_step_s']):.1f} s"))
    if sweep.get("machine"):
        rows.append(("machine", machine_text(sweep["machine"])))
    return rows


def _seconds_per_step(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}"


# The run of record's figures set against a sweep's spread of the same figure: (what, summary key, sweep key).
BAND_FIGURES = (("end (mean of the last 3 evals)", "end_solve_rate_last3", "end_solve_rate_last3"),
                ("within {budget} minutes", "within_budget_solve_rate", "within_budget_solve_rate"),
                ("held out", "held_out_end_solve_rate", "held_out_solve_rate"))


def against_band(summary: dict[str, Any], sweep: dict[str, Any]) -> str | None:
    """Where the run of record's figures fall in a sweep's worst..best (None when the sweep is of another
    environment, or no figure is on both sides)."""
    if sweep.get("env", "maze") != summary.get("env", "maze"):
        return None
    figures = sweep.get("figures", {})
    budget = _budget(sweep)
    if summary.get("budget_min") is not None and _budget(summary) != budget:
        figures = {key: value for key, value in figures.items() if key != "within_budget_solve_rate"}
    parts = []
    for what, mine, theirs in BAND_FIGURES:
        spread = figures.get(theirs)
        if summary.get(mine) is None or not spread:
            continue
        value = float(summary[mine])
        place = ("below the worst" if value < spread["worst"] else "above the best" if value > spread["best"]
                 else "inside")
        parts.append(f"{what.format(budget=budget)} {_rate(value)}, {place}")
    if not parts:
        return None
    return "The run of record of `make demo` against this spread: " + "; ".join(parts) + "."


def sweep_section(sweep: dict[str, Any], image: str, summary: dict[str, Any] | None = None) -> list[str]:
    """A sweep's part of the page: what ran, the figures' spread, where the run of record falls in it,
    the band per eval step, each run."""
    env = sweep.get("env", "")
    starts = ", ".join(f"`{Path(s).name}`" for s in sweep.get("starts", []))
    seeds = ", ".join(str(s) for s in sweep.get("seeds", []))
    lines = [f"## GRPO over seeds and starts: {env}", "",
             f"`{sweep.get('command', 'mmrl sweep')}`: {sweep.get('num_succeeded')} of {sweep.get('num_runs')} runs "
             f"succeeded (starts {starts}; seeds {seeds}). Worst / mean / best over the runs:", "",
             _table(sweep_rows(sweep)), ""]
    placed = against_band(summary or {}, sweep)
    lines += [placed, ""] if placed else []
    lines += [f"![sweep band](images/{image})", "",
             "| step | worst | mean | best |", "| --- | --- | --- | --- |"]
    lines += [f"| {p['step']} | {_rate(p['worst'])} | {_rate(p['mean'])} | {_rate(p['best'])} |"
              for p in sweep.get("band", [])]
    lines += by_start_table(sweep)
    lines += ["", "| start | seed | end (last 3) | within budget | held out | s/step |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{Path(str(r.get('start'))).name}` | {r.get('seed')} | {_rate(r.get('end_solve_rate_last3'))} | "
              f"{_rate(r.get('within_budget_solve_rate'))} | {_rate(r.get('held_out_solve_rate'))} | "
              f"{_seconds_per_step(r.get('mean_step_s'))} |"
              for r in sweep.get("runs", [])]
    return [*lines, ""]


def by_start_table(sweep: dict[str, Any]) -> list[str]:
    """With several SFT starts, each start's worst / mean / best (nothing for one start)."""
    by_start = sweep.get("by_start") or {}
    if len(by_start) < 2:
        return []
    lines = ["", "| start | step 0 | end (last 3) | within budget | held out |", "| --- | --- | --- | --- | --- |"]
    for start, figures in by_start.items():
        cells = [_spread(figures.get(key)) or "-" for key in
                 ("start_solve_rate", "end_solve_rate_last3", "within_budget_solve_rate", "held_out_solve_rate")]
        lines.append(f"| `{Path(start).name}` | {' | '.join(cells)} |")
    return lines


def _table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| | |", "| --- | --- |", *(f"| {what} | {value} |" for what, value in rows)])


def _provenance(summary: dict[str, Any]) -> str:
    parts = []
    if summary.get("command"):
        parts.append(f"`{summary['command']}`")
    if summary.get("commit"):
        parts.append(f"at commit {summary['commit']}")
    if summary.get("run_id"):
        parts.append(f"(run `{summary['run_id']}`)")
    return " ".join(parts)


def _curve_table(curve: dict[str, Any]) -> str:
    """Every eval of the curve; a column whose values are all missing is left out."""
    evals = curve.get("eval") or []
    columns: list[tuple[str, str, Callable[[Any], str]]] = [
        ("step", "step", str), ("greedy", "greedy_solve_rate", _rate),
        ("sampled", "sampled_solve_rate", _rate), ("sampled, solved in any try", "sampled_pass_rate", _rate),
        ("GRPO seconds by its end", "grpo_s", lambda v: "-" if v is None else f"{float(v):,.1f}")]
    kept = [c for c in columns if any(e.get(c[1]) is not None for e in evals)]
    lines = ["| " + " | ".join(c[0] for c in kept) + " |", "|" + " --- |" * len(kept)]
    lines += ["| " + " | ".join(fmt(e.get(key)) for _, key, fmt in kept) + " |" for e in evals]
    return "\n".join(lines)


def render_page(summary: dict[str, Any], curve: dict[str, Any], sweeps: dict[str, dict[str, Any]] | None = None) -> str:
    checks = summary.get("sft_checks") or []
    lines = [
        "# Results",
        "",
        "<!-- Generated by `mmrl report` from docs/results/ (summary.json, curve.json, sweep-<env>.json)."
        " Do not edit; run `mmrl report --update` after a new `make demo`, `--sweep FILE` after a sweep. -->",
        "",
        "The current run of record of `make demo`: the SFT warm start, then GRPO on the tiny model."
        " Solve rates are on the fixed 64-maze eval set unless a row says otherwise.",
    ]
    provenance = _provenance(summary)
    if provenance:
        lines += ["", f"Run: {provenance}."]
    lines += ["", _table(result_rows(summary, curve)), "", "![GRPO curve](images/demo-curve.png)", "",
              "A solved eval episode of the last eval (the frame of each turn, with the action taken):", "",
              "![solved episode](images/demo-solved-episode.png)", ""]
    if curve.get("eval"):
        lines += ["## The curve", "", _curve_table(curve), ""]
    if checks:
        series = [label + " ".join(_rate(c[key]) for c in checks) for label, key in CHECK_SERIES
                  if all(key in c for c in checks)]
        lines += ["## The SFT's checks", "",
                  f"Validation solve rates at updates {checks[0]['updates']}..{checks[-1]['updates']}: "
                  + "; ".join(series) + (f"; kept: {summary['sft_updates']} updates." if summary.get("sft_updates") else "."), ""]
    for env, sweep in sorted((sweeps or {}).items()):
        lines += sweep_section(sweep, f"sweep-{env}-band.png", summary)
    lines += ["How these figures vary between runs and machines, and every other run:"
              " [experiments/README.md](experiments/README.md).", ""]
    return "\n".join(lines)


def render_readme_block(summary: dict[str, Any], curve: dict[str, Any],
                        sweeps: dict[str, dict[str, Any]] | None = None) -> str:
    """The README's table: with sweeps, the SFT start of the run of record and each sweep's worst /
    mean / best; without, the run of record's rows, less the sampled solve rates."""
    rows = [row for row in result_rows(summary, curve) if not row[0].startswith("sampled")]
    if sweeps:
        rows = [row for row in rows if row[0].startswith("SFT start")]
        machines: dict[str, str] = {}  # one row when every sweep ran on the same machine, else one each
        for env, sweep in sorted(sweeps.items(), key=lambda item: item[0] != "maze"):
            for what, value in sweep_rows(sweep):
                if what == "machine":
                    machines[env] = value
                elif what.startswith("time"):  # a mean over the runs, not a spread; the maze's only
                    rows += [(f"{env}: {what}", value)] if env == "maze" else []
                else:
                    rows.append((f"{env}: {what} (worst / mean / best)", value))
        if len(set(machines.values())) == 1:
            rows.append(("machine", next(iter(machines.values()))))
        else:
            rows += [(f"{env}: machine", value) for env, value in machines.items()]
    return "\n".join([README_BEGIN, _table(rows), README_END])


def replace_block(text: str, block: str) -> str:
    """`text` with its results block replaced by `block` (unchanged when it has no block)."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        return text
    return text[:begin] + block + text[end + len(README_END):]


def update_record(args: argparse.Namespace) -> None:
    """Copies the demo's summary and curve (and images, when next to the summary) into the record."""
    summary = json.loads(args.summary.read_text())
    curve = json.loads(args.curve.read_text())
    if args.held_out is not None:
        summary["held_out_start_solve_rate"], summary["held_out_end_solve_rate"] = args.held_out
        summary["held_out_mazes"] = args.held_out_mazes
    for key in ("machine", "commit", "command"):
        if getattr(args, key):
            summary[key] = getattr(args, key)
    summary.setdefault("machine", machine_info())
    for key in ("output_dir", "model_dir", "final_adapter_dir", "curve_png", "solved_episode_png"):
        summary.pop(key, None)  # paths on the machine that ran the demo
    args.record.mkdir(parents=True, exist_ok=True)
    (args.record / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.record / "curve.json").write_text(json.dumps(curve, indent=2) + "\n")
    for name, target in IMAGES.items():
        source = args.summary.parent / name
        if source.is_file():
            args.images.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, args.images / target)


def _local_cut(word: str) -> str:
    """A command's word with a path (one with a "/", or KEY=path) cut to its last name, as the record
    keeps starts."""
    if "/" not in word or word.startswith("-"):
        return word
    if "=" in word:
        key, value = word.split("=", 1)
        return f"{key}={_local_cut(value)}"
    return Path(word).name or word


def update_sweep(args: argparse.Namespace) -> None:
    """Copies a sweep's sweep.json (local paths cut to names) and band.png into the record."""
    sweep = json.loads(args.sweep.read_text())
    if isinstance(sweep.get("command"), str):
        sweep["command"] = " ".join(_local_cut(word) for word in sweep["command"].split(" "))
    sweep["starts"] = [Path(s).name for s in sweep.get("starts", [])]
    for run in sweep.get("runs", []):
        run["start"] = Path(str(run.get("start"))).name
    sweep["by_start"] = {Path(start).name: figures for start, figures in (sweep.get("by_start") or {}).items()}
    if merged_from := [Path(d).name for d in sweep.pop("merged_from", [])]:
        sweep["merged_from"] = merged_from
    args.record.mkdir(parents=True, exist_ok=True)
    (args.record / f"sweep-{sweep['env']}.json").write_text(json.dumps(sweep, indent=2) + "\n")
    band = args.sweep.parent / "band.png"
    if band.is_file():
        args.images.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(band, args.images / f"sweep-{sweep['env']}-band.png")


def _expected(args: argparse.Namespace, summary_path: Path, curve_path: Path) -> dict[Path, str]:
    """What the page (and the README, when it has a results block) should read."""
    summary = json.loads(summary_path.read_text())
    curve = json.loads(curve_path.read_text())
    sweeps = {path.stem.removeprefix("sweep-"): json.loads(path.read_text())
              for path in sorted(args.record.glob("sweep-*.json"))}
    expected = {args.out: render_page(summary, curve, sweeps)}
    if args.readme.is_file():
        expected[args.readme] = replace_block(args.readme.read_text(), render_readme_block(summary, curve, sweeps))
    return expected


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--summary", type=Path, default=Path("outputs/demo-maze/summary.json"),
                        help="a demo's summary.json")
    parser.add_argument("--curve", type=Path, default=Path("outputs/demo-maze/curve.json"), help="a demo's curve.json")
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"), help="the page to write")
    parser.add_argument("--readme", type=Path, default=Path("README.md"),
                        help="whose results block to rewrite (left alone without one)")
    parser.add_argument("--record", type=Path, default=RECORD_DIR, help="the data of record (summary.json, curve.json)")
    parser.add_argument("--images", type=Path, default=Path("docs/images"), help="where --update copies the plots")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true",
                      help="copy --summary and --curve into --record, then render from the record")
    mode.add_argument("--check", action="store_true", help="exit 1 if the page is not what the record renders to")
    mode.add_argument("--from-record", action="store_true", help="render from --record, ignoring --summary/--curve")
    mode.add_argument("--sweep", type=Path, help="copy this sweep.json (and its band.png) into --record, then render "
                                                 "from the record")
    parser.add_argument("--held-out", type=float, nargs=2, metavar=("START", "END"),
                        help="with --update: held-out solve rates of the SFT start and the final adapter")
    parser.add_argument("--held-out-mazes", type=int, default=256, help="with --held-out: how many mazes")
    parser.add_argument("--machine", help="with --update: the machine the demo ran on (default: this one)")
    parser.add_argument("--commit", help="with --update: the commit the demo ran at")
    parser.add_argument("--command", help="with --update: the command that ran the demo")
    args = parser.parse_args(argv)

    if args.update:
        update_record(args)
    if args.sweep:
        update_sweep(args)
    from_record = args.update or args.check or args.from_record or args.sweep is not None
    summary_path = args.record / "summary.json" if from_record else args.summary
    curve_path = args.record / "curve.json" if from_record else args.curve
    for path in (summary_path, curve_path):
        if not path.is_file():
            parser.error(f"{path}: no such file (run `make demo` first, or pass --summary/--curve)")
    expected = _expected(args, summary_path, curve_path)
    if args.check:
        stale = [path for path, text in expected.items() if not path.is_file() or path.read_text() != text]
        for path in stale:
            print(f"{path} is stale: run `mmrl report --from-record`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in expected.items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0
