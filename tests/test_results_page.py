"""`mmrl report`: docs/results.md and README.md's results table, rendered from a demo's summary and
curve, and the committed page kept in step with its data of record (docs/results/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.report.page import README_BEGIN, README_END, main
from mmrl.report.plots import learning_curve

REPO_ROOT = Path(__file__).resolve().parents[1]


def _demo_output(directory: Path, **summary_fields: Any) -> tuple[Path, Path]:
    """A summary.json and curve.json as `mmrl demo` writes them: 3 evals over 20 steps of 60 s."""
    evals = [{"step": step, "greedy_solve_rate": rate, "sampled_solve_rate": sampled, "eval_s": 20.0,
              "adapter_version": step} for step, rate, sampled in ((0, 0.5, 0.4375), (10, 0.71875, 0.6), (20, 0.8125, 0.7))]
    metrics = [{"step": step, "reward/mean": 0.5, "time/step_s": 60.0} for step in range(1, 21)]
    curve = learning_curve(evals, metrics)
    summary = {"start_solve_rate": 0.5, "end_solve_rate": 0.8125, "start_sampled_solve_rate": 0.4375,
               "end_sampled_solve_rate": 0.7, "sft_solve_rate": 0.5, "sft_updates": 700, "budget_min": 15.0,
               "within_budget_step": 10, "within_budget_solve_rate": 0.71875, "within_budget_grpo_s": 640.0,
               "steps": 20, "grpo_wall_s": 1290.4, "sft_wall_s": 2000.0, "mean_step_s": 60.0,
               "run_id": "maze-tiny-cpu-test", "output_dir": "/somewhere/outputs/demo", **summary_fields}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(summary))
    (directory / "curve.json").write_text(json.dumps(curve))
    return directory / "summary.json", directory / "curve.json"


def _rows(page: str) -> dict[str, str]:
    """The results table (the first table of the page): what -> value."""
    rows = {}
    for line in page.split("| --- | --- |", 1)[1].strip().splitlines():
        if not line.startswith("|"):
            break
        what, value = (cell.strip() for cell in line.strip("|").split("|"))
        rows[what] = value
    return rows


def _run(tmp_path: Path, *args: str | Path) -> int:
    return main([*map(str, args), "--out", str(tmp_path / "results.md"), "--readme", str(tmp_path / "README.md"),
                 "--record", str(tmp_path / "record"), "--images", str(tmp_path / "images")])


def test_the_page_shows_the_start_the_mark_within_budget_and_the_end_of_a_demo(tmp_path: Path) -> None:
    summary, curve = _demo_output(tmp_path / "demo", held_out_mazes=256, held_out_start_solve_rate=0.5078125,
                                  held_out_end_solve_rate=0.9140625, machine="2-core test CPU")
    assert _run(tmp_path, "--summary", summary, "--curve", curve) == 0

    page = (tmp_path / "results.md").read_text()
    assert _rows(page) == {
        "SFT start, greedy solve rate": "0.500 (700 updates, 2,000 s)",
        "GRPO within 15 minutes, greedy": "0.719 (step 10, 640 s of GRPO steps and evals)",
        "GRPO at the end, greedy": "0.812 (step 20, 1,290 s of GRPO)",
        "sampled solve rate, start -> end": "0.438 -> 0.700",
        "held out (256 mazes never trained on), start -> end": "0.508 -> 0.914",
        "time per GRPO step (mean)": "60.0 s",
        "machine": "2-core test CPU",
    }
    assert "![GRPO curve](images/demo-curve.png)" in page
    assert "| 10 | 0.719 | 0.600 | 640.0 |" in page  # 10 steps of 60 s and two evals of 20 s


def test_the_sft_checks_show_their_sampled_rates_and_loops_where_the_checks_measured_them(tmp_path: Path) -> None:
    greedy = [{"updates": 500, "validation_solve_rate": 0.5}, {"updates": 600, "validation_solve_rate": 0.5625}]
    sampled = [{**c, "validation_sampled_rate": r} for c, r in zip(greedy, (0.375, 0.5), strict=True)]
    loops = [{**c, "validation_loops": r} for c, r in zip(sampled, (0.25, 0.125), strict=True)]
    for checks, expected in ((greedy, "0.500 0.562; kept: 700 updates."),
                             (sampled, "0.500 0.562; sampled: 0.375 0.500; kept: 700 updates."),
                             (loops, "0.500 0.562; sampled: 0.375 0.500; greedy failed in a loop: 0.250 0.125; "
                                     "kept: 700 updates.")):
        summary, curve = _demo_output(tmp_path / "demo", sft_checks=checks)
        assert _run(tmp_path, "--summary", summary, "--curve", curve) == 0
        assert f"Validation solve rates at updates 500..600: {expected}" in (tmp_path / "results.md").read_text()


def test_a_demo_that_measured_chance_shows_it_under_its_start(tmp_path: Path) -> None:
    summary, curve = _demo_output(tmp_path / "demo", chance_solve_rate=0.0751953125)
    assert _run(tmp_path, "--summary", summary, "--curve", curve) == 0
    rows = list(_rows((tmp_path / "results.md").read_text()).items())
    assert rows[:2] == [("SFT start, greedy solve rate", "0.500 (700 updates, 2,000 s)"),
                        ("A uniform random policy (chance), sampled", "0.075")]


def test_missing_optional_fields_leave_their_rows_out(tmp_path: Path) -> None:
    summary, curve = _demo_output(tmp_path / "demo")
    data = json.loads(summary.read_text())
    for key in ("within_budget_step", "within_budget_solve_rate", "within_budget_grpo_s", "sft_updates",
                "start_sampled_solve_rate", "mean_step_s"):
        del data[key]
    summary.write_text(json.dumps(data))
    assert _run(tmp_path, "--summary", summary, "--curve", curve) == 0

    rows = _rows((tmp_path / "results.md").read_text())
    assert rows == {"SFT start, greedy solve rate": "0.500 (2,000 s)",
                    "GRPO at the end, greedy": "0.812 (step 20, 1,290 s of GRPO)"}


def test_update_copies_a_demo_into_the_record_and_check_fails_once_the_record_changes(tmp_path: Path) -> None:
    summary, curve = _demo_output(tmp_path / "demo")
    (tmp_path / "demo" / "curve.png").write_bytes(b"png")
    (tmp_path / "README.md").write_text(f"# MMRL\n\n{README_BEGIN}\nold table\n{README_END}\n\nmore\n")
    assert _run(tmp_path, "--update", "--summary", summary, "--curve", curve, "--held-out", "0.5", "0.75",
                "--machine", "2-core test CPU", "--commit", "abc1234") == 0

    record = json.loads((tmp_path / "record" / "summary.json").read_text())
    assert (record["held_out_start_solve_rate"], record["held_out_end_solve_rate"]) == (0.5, 0.75)
    assert record["commit"] == "abc1234" and "output_dir" not in record
    assert (tmp_path / "images" / "demo-curve.png").read_bytes() == b"png"
    readme = (tmp_path / "README.md").read_text()
    assert "old table" not in readme and "| held out (256 mazes never trained on), start -> end | 0.500 -> 0.750 |" in readme
    assert readme.endswith(f"{README_END}\n\nmore\n")
    assert _run(tmp_path, "--check") == 0

    record["end_solve_rate"] = 0.9
    (tmp_path / "record" / "summary.json").write_text(json.dumps(record))
    assert _run(tmp_path, "--check") == 1
    assert _run(tmp_path, "--from-record") == 0
    assert _run(tmp_path, "--check") == 0


def test_the_committed_results_page_and_readme_table_are_what_the_record_renders_to() -> None:
    assert main(["--check", "--record", str(REPO_ROOT / "docs" / "results"), "--out",
                 str(REPO_ROOT / "docs" / "results.md"), "--readme", str(REPO_ROOT / "README.md")]) == 0
    assert README_BEGIN in (REPO_ROOT / "README.md").read_text()


def test_a_sweep_puts_its_worst_mean_and_best_on_the_page_and_in_the_readme_table(tmp_path: Path) -> None:
    from mmrl.demo.aggregate import aggregate

    summary, curve = _demo_output(tmp_path / "demo")
    (tmp_path / "README.md").write_text(f"intro\n{README_BEGIN}\nold\n{README_END}\nrest\n")
    assert _run(tmp_path, "--summary", summary, "--curve", curve, "--update") == 0
    runs = [{"start": f"/somewhere/sft-{start}", "seed": seed, "state": "succeeded", "steps": 110,
             "start_solve_rate": 0.5, "end_solve_rate_last3": rate, "within_budget_solve_rate": rate,
             "held_out_start_solve_rate": 0.45, "held_out_solve_rate": rate - 0.05, "mean_step_s": 9.0}
            for (start, seed), rate in zip([("a", 0), ("a", 1), ("b", 0)], (0.9, 0.95, 1.0), strict=True)]
    curves = [{"eval": [{"step": 0, "greedy_solve_rate": 0.5}, {"step": 110, "greedy_solve_rate": r["end_solve_rate_last3"]}]}
              for r in runs]
    sweep = {**aggregate(runs, curves), "env": "maze", "seeds": [0, 1], "starts": ["/somewhere/sft-a", "/x/sft-b"],
             "budget_min": 30.0, "machine": {"cpus": 2, "cpu": "Test CPU", "cpu_flags": ["avx2"], "torch": "2.13.0",
                                              "torch_threads": 2, "commit": "abc1234"},
             "command": "mmrl sweep --sft-model /somewhere/sft-a --seeds 0,1 --set model=/m/tiny --out /x/out"}
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps(sweep))
    assert _run(tmp_path, "--sweep", tmp_path / "sweep" / "sweep.json") == 0

    page = (tmp_path / "results.md").read_text()
    assert "## GRPO over seeds and starts: maze" in page and "`sft-a`, `sft-b`" in page and "/somewhere" not in page
    assert "`mmrl sweep --sft-model sft-a --seeds 0,1 --set model=tiny --out out`" in page and "/x/" not in page
    assert "| end (step 110, mean of the last 3 evals), greedy | 0.900 / 0.950 / 1.000 (3 runs) |" in page
    assert "| 110 | 0.900 | 0.950 | 1.000 |" in page
    assert "| gain within 30 minutes (its last eval less the start) | +0.400 / +0.450 / +0.500 (3 runs) |" in page
    assert "| gain held out (the end less the start) | +0.400 / +0.450 / +0.500 (3 runs) |" in page
    assert "| held out at the start, greedy | 0.450 / 0.450 / 0.450 (3 runs) |" in page
    readme = (tmp_path / "README.md").read_text()
    table = readme[readme.index(README_BEGIN):readme.index(README_END)]
    assert "| SFT start, greedy solve rate | 0.500 (700 updates, 2,000 s) |" in table
    assert "| maze: held out at the end, greedy (worst / mean / best) | 0.850 / 0.900 / 0.950 (3 runs) |" in table
    assert "GRPO at the end" not in table  # one run's figure gives way to the sweep's
    assert "| maze: time per GRPO step (mean over runs) |" in table  # a mean, not worst / mean / best
    assert "| machine | 2-core Test CPU (avx2), torch 2.13.0 x2 threads, commit abc1234 |" in table
    assert _run(tmp_path, "--check") == 0

    # A second environment's sweep on another machine: each sweep's rows keep their own machine.
    other = {**sweep, "env": "sokoban", "machine": {**sweep["machine"], "cpu": "Other CPU"}}
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps(other))
    assert _run(tmp_path, "--sweep", tmp_path / "sweep" / "sweep.json") == 0
    readme = (tmp_path / "README.md").read_text()
    table = readme[readme.index(README_BEGIN):readme.index(README_END)]
    assert "| maze: machine | 2-core Test CPU (avx2), torch 2.13.0 x2 threads, commit abc1234 |" in table
    assert "| sokoban: machine | 2-core Other CPU (avx2), torch 2.13.0 x2 threads, commit abc1234 |" in table
    assert "| machine |" not in table


def test_the_page_says_where_the_run_of_record_falls_in_the_sweeps_spread(tmp_path: Path) -> None:
    from mmrl.demo.aggregate import aggregate
    from mmrl.report.page import against_band

    runs = [{"start": "/s/sft-a", "seed": seed, "state": "succeeded", "steps": 110, "start_solve_rate": 0.5,
             "end_solve_rate_last3": rate, "within_budget_solve_rate": rate, "held_out_solve_rate": rate - 0.05}
            for seed, rate in enumerate((0.8, 0.9))]
    curves = [{"eval": [{"step": 0, "greedy_solve_rate": 0.5}]} for _ in runs]
    sweep = {**aggregate(runs, curves), "env": "maze", "budget_min": 30.0}
    summary, curve = _demo_output(tmp_path / "demo", budget_min=30.0, end_solve_rate_last3=0.95,
                                  within_budget_solve_rate=0.8, held_out_end_solve_rate=0.7)
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps(sweep))
    assert _run(tmp_path, "--summary", summary, "--curve", curve, "--update") == 0
    assert _run(tmp_path, "--sweep", tmp_path / "sweep" / "sweep.json") == 0

    page = (tmp_path / "results.md").read_text()
    assert _rows(page)["GRPO at the end, mean of the last 3 evals, greedy"] == "0.950"
    assert ("The run of record of `make demo` against this spread: end (mean of the last 3 evals) 0.950, above the "
            "best; within 30 minutes 0.800, inside; held out 0.700, below the worst.") in page
    record = json.loads(summary.read_text())
    assert against_band({**record, "env": "maze"}, {**sweep, "env": "sokoban"}) is None  # another env's sweep
    other_budget = against_band({**record, "budget_min": 15.0}, sweep) or ""
    assert "end (mean of the last 3 evals) 0.950" in other_budget and "within" not in other_budget
