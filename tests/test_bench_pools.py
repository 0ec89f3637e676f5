"""`mmrl bench pools` passes only when every run's checks hold and the shared runs really ran at once
on two different pools."""

from __future__ import annotations

from typing import Any

from mmrl.bench.pools import passed, summary_lines


def _way(pools: tuple[str, str], overlapped: bool, **broken: Any) -> dict[str, Any]:
    runs = [{"run_id": f"r{i}", "learner": pool, "state": "succeeded", "failure_reason": "", "steps": 4,
             "step_s_mean": 1.0, "steps_exact": True, "adapters_valid": True, "sampled_as_meant": True}
            for i, pool in enumerate(pools)]
    runs[1].update(broken)
    return {"wall_s": 10.0, "overlapped": overlapped, "runs": runs}


def test_the_bench_passes_when_the_shared_runs_overlapped_on_two_pools_and_every_check_held() -> None:
    sequential = _way(("a", "a"), overlapped=False)
    assert passed(_way(("a", "b"), overlapped=True), sequential)
    assert not passed(_way(("a", "b"), overlapped=False), sequential)  # one after the other after all
    assert not passed(_way(("a", "a"), overlapped=True), sequential)  # both on one pool
    assert not passed(_way(("a", "b"), overlapped=True, steps_exact=False), sequential)
    assert not passed(_way(("a", "b"), overlapped=True), _way(("a", "a"), False, state="failed"))


def test_the_table_has_a_row_per_run_and_the_wall_time_ratio() -> None:
    lines = summary_lines(_way(("a", "b"), overlapped=True), _way(("a", "a"), overlapped=False))
    assert len(lines) == 2 + 4 + 1
    assert lines[-1].startswith("shared / sequential wall time: 1.00")
