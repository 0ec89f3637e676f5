"""`mmrl sweep merge`: finished sweeps' runs as one distribution, refused when they differ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mmrl.cli.main import main as mmrl_main
from mmrl.demo.merge import merge
from mmrl.report.page import by_start_table, sweep_section
from services.common.user_errors import UsageError

MACHINE = {"cpu": "Intel(R) Xeon(R) Processor", "cpus": 2, "cpu_flags": ["avx2", "avx512f"], "torch": "2.13.0",
           "torch_threads": 2, "commit": "abc1234"}


def _config(seed: int, model: str, **optim: Any) -> dict[str, Any]:
    return {"name": "maze-tiny-cpu", "seed": seed, "model": model, "env": {"name": "maze", "max_moves": 20},
            "optim": {"learning_rate": 0.002, **optim}, "endpoints": {"env": [f"127.0.0.1:{5000 + seed}"]}}


def _write_run(sweep: Path, start: str, seed: int, rates: list[float], machine: dict[str, Any] | None = None,
               **optim: Any) -> None:
    run = sweep / f"{Path(start).name}-seed{seed}"
    run.mkdir(parents=True)
    summary = {"state": "succeeded", "start": start, "seed": seed, "run_id": f"r-{Path(start).name}-{seed}",
               "steps": 10 * (len(rates) - 1), "mean_step_s": 12.0, "start_solve_rate": rates[0],
               "end_solve_rate": rates[-1], "end_solve_rate_last3": sum(rates[-3:]) / len(rates[-3:]),
               "within_budget_solve_rate": rates[-1], "held_out_solve_rate": 0.6, "budget_min": 30.0,
               "machine": machine or MACHINE}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "curve.json").write_text(json.dumps({"eval": [{"step": 10 * i, "greedy_solve_rate": r}
                                                         for i, r in enumerate(rates)]}))
    (run / "run_config.json").write_text(json.dumps(_config(seed, start, **optim)))


def _sweep(path: Path, start: str, seeds: list[int], rates: list[float], command: str) -> Path:
    for seed in seeds:
        _write_run(path, start, seed, rates)
    (path / "sweep.json").write_text(json.dumps({"env": "maze", "command": command}))
    return path


def test_two_starts_merge_into_one_distribution_with_each_start_beside_it(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a = _sweep(tmp_path / "a", "/x/sft-maze", [0, 1], [0.5, 0.6, 0.7, 0.8], "mmrl sweep --seeds 0,1")
    b = _sweep(tmp_path / "b", "/x/sft-maze-u700", [0, 2], [0.4, 0.9, 0.9, 0.9], "mmrl sweep --sft-model /x/u700")
    out = tmp_path / "merged"
    assert mmrl_main(["sweep", "merge", str(a), str(b), "--out", str(out)]) == 0
    result = json.loads((out / "sweep.json").read_text())
    assert (out / "band.png").read_bytes()[:4] == b"\x89PNG"
    assert result["num_runs"] == 4 and result["seeds"] == [0, 1, 2] and result["env"] == "maze"
    assert result["starts"] == ["/x/sft-maze", "/x/sft-maze-u700"]
    assert result["figures"]["end_solve_rate_last3"]["worst"] == pytest.approx(0.7)
    assert result["by_start"]["/x/sft-maze-u700"]["end_solve_rate_last3"]["mean"] == pytest.approx(0.9)
    assert result["band"][1] == {"step": 10, "worst": 0.6, "mean": pytest.approx(0.75), "best": 0.9, "num": 4}
    assert result["command"].startswith("mmrl sweep --seeds 0,1 ; mmrl sweep --sft-model /x/u700 ; mmrl sweep merge")
    assert "sft-maze-u700 end_solve_rate_last3: worst 0.900" in capsys.readouterr().out
    table = by_start_table(result)
    assert table[-2].startswith("| `sft-maze` | 0.500 / 0.500 / 0.500 (2 runs) | 0.700 / 0.700 / 0.700 (2 runs)")
    assert "| `sft-maze-u700` |" in "\n".join(sweep_section(result, "band.png"))


def test_one_start_has_no_table_per_start(tmp_path: Path) -> None:
    result, _, _ = merge([_sweep(tmp_path / "a", "/x/s", [0, 1], [0.5, 0.6], "c")], "m")
    assert by_start_table(result) == []


def test_runs_of_different_settings_are_refused_with_the_setting_named(tmp_path: Path) -> None:
    a = _sweep(tmp_path / "a", "/x/s", [0], [0.5, 0.6], "c")
    _write_run(tmp_path / "b", "/x/t", 0, [0.5, 0.6], learning_rate=0.004)
    with pytest.raises(UsageError, match=r"different settings: optim.learning_rate: 0.002 vs 0.004"):
        merge([a, tmp_path / "b"], "m")


def test_a_setting_a_run_predates_counts_at_its_default(tmp_path: Path) -> None:
    """An older run's config lacks a setting added since; it ran what the default runs."""
    a = _sweep(tmp_path / "a", "/x/s", [0], [0.5, 0.6], "c")
    for name, coef in (("b", 0.0), ("c", 0.01)):
        _write_run(tmp_path / name, "/x/t", 0, [0.5, 0.6])
        run_config = tmp_path / name / "t-seed0" / "run_config.json"
        run_config.write_text(json.dumps({**json.loads(run_config.read_text()), "loss": {"entropy_coef": coef}}))
    result, _, _ = merge([a, tmp_path / "b"], "m")
    assert result["num_runs"] == 2
    with pytest.raises(UsageError, match=r"different settings: loss.entropy_coef: 0.0 vs 0.01"):
        merge([a, tmp_path / "c"], "m")


def test_runs_of_different_machines_are_refused_but_commits_may_differ(tmp_path: Path) -> None:
    a = _sweep(tmp_path / "a", "/x/s", [0], [0.5, 0.6], "c")
    _write_run(tmp_path / "b", "/x/t", 0, [0.5, 0.6], machine={**MACHINE, "commit": "def5678"})
    result, _, _ = merge([a, tmp_path / "b"], "m")
    assert result["machine"]["commit"] == "abc1234, def5678"
    _write_run(tmp_path / "c", "/x/u", 0, [0.5, 0.6], machine={**MACHINE, "cpu_flags": ["avx2"]})
    with pytest.raises(UsageError, match=r"different machines: cpu_flags"):
        merge([a, tmp_path / "c"], "m")


def test_the_same_start_and_seed_twice_is_refused(tmp_path: Path) -> None:
    a = _sweep(tmp_path / "a", "/x/s", [0, 1], [0.5, 0.6], "c")
    b = _sweep(tmp_path / "b", "/x/s", [1], [0.5, 0.6], "c")
    with pytest.raises(UsageError, match=r"start s seed 1 is in both"):
        merge([a, b], "m")


def test_a_directory_without_runs_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert mmrl_main(["sweep", "merge", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "no runs in it" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
