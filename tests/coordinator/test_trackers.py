"""Trackers fed by the run store (real Redis): TensorBoard event files read back with TensorBoard's own
reader, trackers that cannot start or that fail later, and the coordinator's Prometheus text."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from services.coordinator.ops import prometheus
from services.coordinator.ops.trackers import RecordingStore, tensorboard_dir


def _frames(directory: Path, count: int) -> list[str]:
    directory.mkdir(parents=True)
    paths = []
    for turn in range(count):
        buffer = io.BytesIO()
        Image.new("RGB", (80, 80), (turn * 20, 100, 100)).save(buffer, format="PNG")
        (directory / f"turn_{turn:03d}.png").write_bytes(buffer.getvalue())
        paths.append(str(directory / f"turn_{turn:03d}.png"))
    return paths


def _step_metrics(step: int) -> dict[str, Any]:
    return {"step": step, "reward/mean": 0.1 * step, "train/solve_rate": 0.05 * step,
            "episodes/played_solve_rate": 0.02 * step, "train/loss": None,
            "train/grad_norm": 2.0, "train/skipped": False, "time/rollout_s": 1.5, "time/train_s": 0.5,
            "time/sync_s": 0.2, "time/env_s": 0.1, "time/step_s": 2.4}


def _accumulator(logdir: Path) -> EventAccumulator:
    events = EventAccumulator(str(logdir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


async def test_tensorboard_files_hold_every_step_metric_and_each_evals_scalars_and_image(
        store: Any, tmp_path: Path) -> None:
    run = await store.create_run("tb-run", "tb", {}, 3)
    recording = await RecordingStore.open(store, run["id"], ["tensorboard"], {}, tmp_path)
    run_dir = tmp_path / "runs" / run["id"]  # episode records name frames relative to the run's directory
    frames = [str(Path(f).relative_to(run_dir)) for f in _frames(run_dir / "episodes" / "eval_step_000000", 12)]
    await recording.record_eval(run["id"], 0, {"step": 0, "greedy_solve_rate": 0.25, "eval_s": 3.0},
                                {"eval-0-0": {"frames": frames}, "eval-0-1": {"frames": frames[:3]}})
    for step in (1, 2, 3):
        await recording.commit_step(run["id"], step, _step_metrics(step), {})
    await recording.close_trackers()

    events = _accumulator(tensorboard_dir(tmp_path, run["id"]))
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward/mean")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [e.value for e in events.Scalars("train/skipped")] == [0.0] * 3
    assert {"train/solve_rate", "train/grad_norm", "time/step_s"} <= set(events.Tags()["scalars"])
    assert "train/loss" not in events.Tags()["scalars"]  # null (a skipped step's NaN) is left out
    assert [(e.step, e.value) for e in events.Scalars("eval/greedy_solve_rate")] == [(0, 0.25)]
    (image,) = events.Images("eval/episodes")
    assert (image.step, image.width, image.height) == (0, 8 * 80, 2 * 80)  # 8 frames of 2 episodes
    assert [m["step"] for m in await store.metrics(run["id"])] == [1, 2, 3]  # Redis records as before


async def test_a_resumed_run_replaces_the_tensorboard_values_of_the_steps_it_replays(
        store: Any, tmp_path: Path) -> None:
    run = await store.create_run("tb-resume", "tb", {}, 3)
    first = await RecordingStore.open(store, run["id"], ["tensorboard"], {}, tmp_path)
    for step in (1, 2, 3):
        await first.commit_step(run["id"], step, _step_metrics(step), {})
    await first.close_trackers()
    again = await RecordingStore.open(store, run["id"], ["tensorboard"], {}, tmp_path)  # resumed from step 1
    await again.commit_step(run["id"], 2, {**_step_metrics(2), "reward/mean": 0.9}, {})
    await again.close_trackers()
    events = _accumulator(tensorboard_dir(tmp_path, run["id"]))
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward/mean")] == [(1, 0.1), (2, 0.9)]


async def test_a_tracker_that_cannot_start_is_one_warning_and_the_others_still_record(
        store: Any, tmp_path: Path, caplog: Any) -> None:
    run = await store.create_run("tb-wandb", "tb", {}, 1)
    recording = await RecordingStore.open(store, run["id"], ["wandb", "tensorboard"], {}, tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "tracker" in r.getMessage()]
    assert len(warnings) == 1 and "tracker wandb is off" in warnings[0] and "mmrl[wandb]" in warnings[0]
    events = await store.read_events(run["id"], block_ms=1)
    assert [e["data"]["message"] for _, e in events if e["kind"] == "warning"] == warnings
    await recording.commit_step(run["id"], 1, _step_metrics(1), {})
    await recording.close_trackers()
    assert _accumulator(tensorboard_dir(tmp_path, run["id"])).Scalars("reward/mean")


async def test_a_tracker_failing_mid_run_is_dropped_and_the_step_is_still_recorded(
        store: Any, tmp_path: Path, caplog: Any) -> None:
    run = await store.create_run("tb-broken", "tb", {}, 2)
    recording = await RecordingStore.open(store, run["id"], ["tensorboard"], {}, tmp_path)

    class Broken:
        def log_step(self, step: int, metrics: dict[str, float]) -> None:
            raise ConnectionError("tracking server went away")

    recording.trackers.trackers["broken"] = Broken()  # type: ignore[assignment]
    await recording.commit_step(run["id"], 1, _step_metrics(1), {})
    await recording.commit_step(run["id"], 2, _step_metrics(2), {})
    await recording.close_trackers()
    assert "broken" not in recording.trackers.trackers
    assert sum("tracker broken failed" in r.getMessage() for r in caplog.records) == 1
    assert [m["step"] for m in await store.metrics(run["id"])] == [1, 2]


async def test_coordinator_metrics_hold_run_states_newest_values_and_phase_histograms(
        store: Any, tmp_path: Path) -> None:
    from services.coordinator.ops.store import RunState

    run = await store.create_run("prom-run", "prom", {}, 2)
    await store.set_state(run["id"], RunState.RUNNING)
    recording = await RecordingStore.open(store, run["id"], [], {}, tmp_path)
    await recording.commit_step(run["id"], 1, _step_metrics(1), {})
    await recording.record_eval(run["id"], 1, {"step": 1, "greedy_solve_rate": 0.5, "sampled_solve_rate": 0.25,
                                               "eval_s": 4.0}, {})
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families((await prometheus.render(store)).decode()) for s in f.samples}
    rid = ("run_id", run["id"])
    assert samples[("mmrl_runs", (("state", "running"),))] == 1
    assert samples[("mmrl_run_step", (rid,))] == 1
    assert samples[("mmrl_run_reward_mean", (rid,))] == 0.1
    assert samples[("mmrl_run_train_solve_rate", (rid,))] == 0.05
    assert samples[("mmrl_run_played_solve_rate", (rid,))] == 0.02
    assert samples[("mmrl_run_eval_greedy_solve_rate", (rid,))] == 0.5
    assert samples[("mmrl_run_eval_sampled_solve_rate", (rid,))] == 0.25
    for phase, seconds in (("rollout", 1.5), ("train", 0.5), ("sync", 0.2), ("env", 0.1), ("eval", 4.0)):
        assert samples[("mmrl_run_phase_seconds_sum", (("phase", phase), rid))] == seconds
        assert samples[("mmrl_run_phase_seconds_count", (("phase", phase), rid))] == 1
