"""Experiment trackers: every step's metrics and every eval of a run, beside Redis.

`loggers` in the run config picks them: "tensorboard" (the default: event files under
`<shared root>/runs/<run_id>/tensorboard/`, read by `tensorboard --logdir`, no account or network),
"wandb" and "mlflow" (optional packages, configured by their own environment variables:
WANDB_API_KEY / WANDB_PROJECT / WANDB_MODE, MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME). A tracker
that cannot start (package missing, no credentials) is reported in one log line and a "warning"
event at run start and left out; one that fails later is dropped the same way. A tracker never
fails a run.

`RecordingStore` is the hook: the run store of one run, whose `commit_step` and `record_eval` also
feed the trackers and the coordinator's Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from services.common.config_files import flatten_settings
from services.coordinator.ops import prometheus
from services.coordinator.ops.store import RunStore

log = logging.getLogger("mmrl.coordinator.trackers")

TrackerName = Literal["tensorboard", "wandb", "mlflow"]
EVAL_IMAGE_EPISODES = 4  # greedy eval episodes drawn in each eval's image
EVAL_IMAGE_FRAMES = 8  # frames per episode (evenly spaced, the last included)


class Tracker(Protocol):
    def log_step(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_eval(self, step: int, summary: dict[str, float], frames: list[list[str]]) -> None: ...
    def close(self) -> None: ...


def scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers (and booleans, as 0/1) of a record, keyed `prefix + key`."""
    out = {}
    for key, value in record.items():
        if isinstance(value, bool | int | float) and math.isfinite(float(value)) and key != "step":
            out[prefix + key] = float(value)
    return out


def tensorboard_dir(shared_root: Path, run_id: str) -> Path:
    return shared_root / "runs" / run_id / "tensorboard"


class TensorBoardTracker:
    """Event files written by tensorboardX (no TensorFlow, no torch). The writer opens at the first
    record, discarding any earlier events from that step on (a resumed run replays its steps)."""

    def __init__(self, logdir: Path) -> None:
        import tensorboardX  # noqa: F401 - fails here (at run start) when missing

        self.logdir = logdir
        self._writer: Any = None

    def _open(self, step: int) -> Any:
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self.logdir.mkdir(parents=True, exist_ok=True)
            # A unique suffix that sorts by creation: two writers started within one second would
            # otherwise share a file name, and TensorBoard reads the files in name order (a resumed
            # run's purge must come after the events it purges).
            self._writer = SummaryWriter(logdir=str(self.logdir), purge_step=step if step > 0 else None,
                                         filename_suffix=f".{time.time_ns():020d}")
        return self._writer

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        writer = self._open(step)
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def log_eval(self, step: int, summary: dict[str, float], frames: list[list[str]]) -> None:
        writer = self._open(step)
        for key, value in summary.items():
            writer.add_scalar(f"eval/{key}", value, step)
        image = frame_grid(frames)
        if image is not None:
            writer.add_image("eval/episodes", image, step, dataformats="HWC")
        writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WandbTracker:
    def __init__(self, run_id: str, config: dict[str, Any]) -> None:
        import wandb

        self._wandb = wandb
        self._run = wandb.init(id=run_id, name=run_id, config=config, resume="allow")

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def log_eval(self, step: int, summary: dict[str, float], frames: list[list[str]]) -> None:
        record: dict[str, Any] = {f"eval/{k}": v for k, v in summary.items()}
        image = frame_grid(frames)
        if image is not None:
            record["eval/episodes"] = self._wandb.Image(image)
        self._run.log(record, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    def __init__(self, run_id: str, config: dict[str, Any]) -> None:
        import mlflow

        self._mlflow = mlflow
        self._client = mlflow.MlflowClient()
        experiment = mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "mmrl"))
        found = self._client.search_runs([experiment.experiment_id], filter_string=f"tags.mmrl_run_id = '{run_id}'")
        self._run_id = found[0].info.run_id if found else self._client.create_run(
            experiment.experiment_id, tags={"mmrl_run_id": run_id}, run_name=run_id).info.run_id
        for key, value in flatten_settings(config).items():
            self._client.log_param(self._run_id, key[:250], str(value)[:500])

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._client.log_metric(self._run_id, key, value, step=step)

    def log_eval(self, step: int, summary: dict[str, float], frames: list[list[str]]) -> None:
        self.log_step(step, {f"eval/{k}": v for k, v in summary.items()})

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def frame_grid(frames: list[list[str]]) -> Any:
    """One RGB array (HWC, uint8) of a few episodes' frames, one row per episode; None without frames."""
    rows = [paths for paths in frames[:EVAL_IMAGE_EPISODES] if paths]
    if not rows:
        return None
    import numpy as np
    from PIL import Image

    def pick(paths: list[str]) -> list[str]:
        if len(paths) <= EVAL_IMAGE_FRAMES:
            return paths
        last = len(paths) - 1
        return [paths[round(i * last / (EVAL_IMAGE_FRAMES - 1))] for i in range(EVAL_IMAGE_FRAMES)]

    images = [[Image.open(p).convert("RGB") for p in pick(paths)] for paths in rows]
    width, height = max(i.width for row in images for i in row), max(i.height for row in images for i in row)
    grid = Image.new("RGB", (width * max(len(row) for row in images), height * len(images)), (0, 0, 0))
    for r, row in enumerate(images):
        for c, image in enumerate(row):
            grid.paste(image, (c * width, r * height))
    return np.asarray(grid)


class Trackers:
    """The trackers of one run; a failing one is dropped with one log line."""

    def __init__(self, run_id: str, trackers: dict[str, Tracker], run_dir: Path | None = None) -> None:
        self.run_id = run_id
        self.trackers = trackers
        self.run_dir = run_dir  # episode records name their frames relative to it

    @classmethod
    def open(cls, run_id: str, names: Sequence[str], config: dict[str, Any], shared_root: Path) -> tuple[Trackers, list[str]]:
        """The trackers that could start, and one message per tracker that could not."""
        opened: dict[str, Tracker] = {}
        problems = []
        for name in names:
            try:
                if name == "tensorboard":
                    opened[name] = TensorBoardTracker(tensorboard_dir(shared_root, run_id))
                elif name == "wandb":
                    opened[name] = WandbTracker(run_id, config)
                elif name == "mlflow":
                    opened[name] = MlflowTracker(run_id, config)
                else:
                    raise ValueError(f"unknown tracker {name!r}")
            except ImportError as exc:
                problems.append(f"tracker {name} is off: its package is not installed ({exc.name}); "
                                f"pip install 'mmrl[{name}]'")
            except Exception as exc:  # noqa: BLE001 - credentials, network, server: never fail the run
                problems.append(f"tracker {name} is off: it could not start ({type(exc).__name__}: {exc})")
        for problem in problems:
            log.warning(problem, extra={"run_id": run_id})
        return cls(run_id, opened, shared_root / "runs" / run_id), problems

    def _each(self, what: str, call: Any) -> None:
        for name, tracker in list(self.trackers.items()):
            try:
                call(tracker)
            except Exception as exc:  # noqa: BLE001
                log.warning(f"tracker {name} failed ({what}: {type(exc).__name__}: {exc}); it is off for the "
                            "rest of the run", extra={"run_id": self.run_id})
                self.trackers.pop(name, None)

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        values = scalars(metrics)
        self._each("step", lambda t: t.log_step(step, values))

    def log_eval(self, step: int, summary: dict[str, Any], episodes: dict[str, dict[str, Any]]) -> None:
        values = scalars(summary)
        base = self.run_dir or Path()
        frames = [[str(base / f) for f in e.get("frames") or []] for _, e in sorted(episodes.items())]
        self._each("eval", lambda t: t.log_eval(step, values, frames))

    def close(self) -> None:
        self._each("close", lambda t: t.close())


class RecordingStore(RunStore):
    """One run's store: what it records also goes to the trackers and the Prometheus metrics."""

    def __init__(self, store: RunStore, trackers: Trackers) -> None:
        super().__init__(store.r)
        self.trackers = trackers

    @classmethod
    async def open(cls, store: RunStore, run_id: str, names: Sequence[str], config: dict[str, Any],
                   shared_root: Path) -> RecordingStore:
        trackers, problems = await asyncio.to_thread(Trackers.open, run_id, names, config, shared_root)
        for problem in problems:
            await store.add_event(run_id, "warning", {"message": problem})
        return cls(store, trackers)

    async def commit_step(self, run_id: str, step: int, metrics: dict[str, Any],
                          episodes: dict[str, dict[str, Any]]) -> None:
        await super().commit_step(run_id, step, metrics, episodes)
        prometheus.record_step(run_id, metrics)
        await asyncio.to_thread(self.trackers.log_step, step, metrics)

    async def record_eval(self, run_id: str, step: int, summary: dict[str, Any],
                          episodes: dict[str, dict[str, Any]]) -> None:
        await super().record_eval(run_id, step, summary, episodes)
        prometheus.record_eval(run_id, summary)
        await asyncio.to_thread(self.trackers.log_eval, step, summary, episodes)

    async def close_trackers(self) -> None:
        await asyncio.to_thread(self.trackers.close)
