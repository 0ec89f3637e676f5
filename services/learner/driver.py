"""Rank 0 drives every rank: `LearnerDriver` validates a request on rank 0 (so bad input changes
no state on any rank), broadcasts the command over the control group and runs it locally; the
other ranks sit in `worker_loop`, running each command they receive. One rank is a valid world:
then nothing is sent.

Errors: ValueError for bad input (INVALID_ARGUMENT), StateError when the request does not fit the
learner's state (FAILED_PRECONDITION), FileNotFoundError for a missing checkpoint (NOT_FOUND).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from services.common import storage
from services.common.training import TrainSettings
from services.common.trajectory import Trajectory
from services.learner import checkpoint as ckpt
from services.learner.batch import prepare_batch, prepare_trajectory
from services.learner.distributed import broadcast_object, plan_shards, scatter_objects
from services.learner.engine import LearnerEngine, LearnerState, existing_run_versions
from services.learner.policy import lora_targets
from services.learner.publish import PublishedAdapter, next_adapter_version
from services.learner.trainer import BatchTotals, MiniBatch

log = logging.getLogger("mmrl.learner")

CONFIG_FILE = "learner_config.json"


class StateError(Exception):
    """The request does not fit the learner's current state."""


@dataclass(frozen=True)
class Command:
    """What rank 0 broadcasts; the train command's trajectories follow by scatter."""

    kind: Literal["configure", "train", "publish", "save", "load", "reset", "stop"]
    run_id: str = ""
    config_json: str = ""
    path: str = ""
    version: int = 0
    totals: tuple[BatchTotals, ...] = ()


@dataclass(frozen=True)
class TrainResult:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    skipped: bool = False


class LearnerDriver:
    """Rank 0's entry to the learner: one method per RPC, called from one thread at a time."""

    def __init__(self, engine: LearnerEngine) -> None:
        assert engine.ctx.is_main, "only rank 0 drives"
        self.engine = engine
        self.ctx = engine.ctx
        self.shared_root = Path(engine.settings.shared_root)
        # The checkpoint that holds exactly the current state (saved or restored, not trained since).
        self._state_checkpoint: Path | None = None

    def _send(self, command: Command) -> None:
        if self.ctx.world_size > 1:
            broadcast_object(command, self.ctx)

    def _require(self, run_id: str) -> None:
        run = self.engine.run
        if run is None:
            raise StateError(f"the learner is not configured; call ConfigureRun for run {run_id!r} first")
        if run.run_id != run_id:
            raise StateError(f"the learner is configured for run {run.run_id!r}, not {run_id!r}")

    def state(self, run_id: str) -> LearnerState:
        self._require(run_id)
        return self.engine.state()

    def configure(self, run_id: str, config_json: str) -> LearnerState:
        """Binds the learner to `run_id`; resumes from the run's newest complete checkpoint. A repeat
        with the same config is a no-op; a different config for the configured run is refused."""
        storage.validate_run_id(run_id)
        config = TrainSettings.from_json(config_json)
        lora_targets(self.engine.module_kinds, config.lora.target_modules)  # every rank would fail alike
        run = self.engine.run
        if run is not None and run.run_id == run_id:
            if run.config == config:
                return self.engine.state()
            raise StateError(f"run {run_id!r} is already configured with a different config")
        for parent in (
            storage.adapters_dir(self.shared_root, run_id),
            storage.checkpoints_dir(self.shared_root, run_id),
        ):
            storage.remove_stale_temporaries(parent)
        checkpoint = ckpt.newest_valid_checkpoint(self.shared_root, run_id)
        if checkpoint is not None:
            self._check_compatible(checkpoint, run_id, config)
        version = existing_run_versions(self.shared_root, run_id)
        run_dir = storage.run_dir(self.shared_root, run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CONFIG_FILE).write_text(config.model_dump_json(indent=2))
        command = Command("configure", run_id=run_id, config_json=config.model_dump_json(), version=version)
        self._send(command)
        self._state_checkpoint = None
        state = self.engine.configure(run_id, config, version)
        if checkpoint is not None:
            state = self._load(checkpoint, reset_on_error=True)
        return state

    def train_step(self, run_id: str, trajectories: Sequence[Trajectory]) -> TrainResult:
        """Validates the whole batch on rank 0, splits it into mini-batches, shards each across
        the ranks (the other ranks get their trajectories by scatter) and trains."""
        self._require(run_id)
        assert self.engine.run is not None
        start = time.perf_counter()
        prepared = prepare_batch(trajectories, self.engine.spec, self.engine.frames, self.engine.action_mask)
        groups = split_minibatches(len(prepared), self.engine.run.config.optim.num_minibatches)
        totals = tuple(BatchTotals.of([prepared[i] for i in group]) for group in groups)
        # plans[j][rank] = [(index into the batch, is_padding), ...]
        plans = [
            [
                [(group[i], pad) for i, pad in shard]
                for shard in plan_shards([prepared[i].num_tokens for i in group], self.ctx.world_size)
            ]
            for group in groups
        ]
        self._send(Command("train", totals=totals))
        self._state_checkpoint = None
        if self.ctx.world_size > 1:
            shards = [
                [[(trajectories[i], pad) for i, pad in plan[rank]] for plan in plans] if rank else []
                for rank in range(self.ctx.world_size)
            ]
            scatter_objects(shards, self.ctx)
        mine = [
            MiniBatch(
                [prepared[i].as_padding() if pad else prepared[i] for i, pad in plan[0]], minibatch_totals
            )
            for plan, minibatch_totals in zip(plans, totals, strict=True)
        ]
        outcome = self.engine.train(mine)
        elapsed = time.perf_counter() - start
        newest = self.engine.state().adapter_version
        metrics = {
            **outcome.metrics,
            "train/step_s": elapsed,
            "train/tokens_per_s": sum(t.num_tokens for t in totals) / elapsed,
            "train/ranks": float(self.ctx.world_size),
            "train/adapter_version_lag_max": float(newest - min(t.adapter_version for t in trajectories)),
        }
        log.info("train step", extra={"run_id": run_id, "step": self.engine.state().step, "metrics": metrics})
        return TrainResult(step=self.engine.state().step, metrics=metrics, skipped=outcome.skipped)

    def publish(self, run_id: str) -> PublishedAdapter:
        self._require(run_id)
        version = next_adapter_version(self.shared_root, run_id, self.engine.state().adapter_version)
        self._send(Command("publish", version=version))
        published = self.engine.publish(version)
        assert published is not None
        log.info(
            "published adapter", extra={"run_id": run_id, "version": version, "path": str(published.path)}
        )
        return published

    def save_checkpoint(self, run_id: str) -> tuple[int, Path, float]:
        """Writes the current step's checkpoint; a repeat after a save or a restore of that very
        checkpoint returns it. A checkpoint of the same step that holds another state (the run was
        restored from an older one and trained again) is refused, not overwritten."""
        self._require(run_id)
        step = self.engine.state().step
        existing = storage.checkpoint_dir(self.shared_root, run_id, step)
        if existing.exists():
            _verify(existing)
            if self._state_checkpoint is None or existing.resolve() != self._state_checkpoint.resolve():
                raise StateError(
                    f"{existing} holds another state of step {step}: the run was restored from an older "
                    "checkpoint and trained again; move that checkpoint (and later ones) away to save this one"
                )
            return step, existing, 0.0
        self._send(Command("save"))
        saved = self.engine.save_checkpoint()
        assert saved is not None
        self._state_checkpoint = saved[0]
        log.info("saved checkpoint", extra={"run_id": run_id, "step": step, "path": str(saved[0])})
        return step, saved[0], saved[1]

    def load_checkpoint(self, run_id: str, path: str) -> LearnerState:
        """Restores a checkpoint: `path`, or the run's newest complete one when empty."""
        self._require(run_id)
        if path:
            directory = Path(path)
            if not storage.is_within(directory, self.shared_root):
                raise ValueError(f"checkpoint path {path!r} is outside the shared root {self.shared_root}")
            if not directory.is_dir():
                raise FileNotFoundError(f"no checkpoint at {path!r}")
        else:
            found = ckpt.newest_valid_checkpoint(self.shared_root, run_id)
            if found is None:
                raise FileNotFoundError(f"run {run_id!r} has no complete checkpoint")
            directory = found
        assert self.engine.run is not None
        self._check_compatible(directory, run_id, self.engine.run.config)
        return self._load(directory, reset_on_error=False)

    def shutdown(self) -> None:
        """Releases the other ranks from `worker_loop`."""
        self._send(Command("stop"))

    def _check_compatible(self, directory: Path, run_id: str, config: TrainSettings) -> None:
        _verify(directory)
        try:
            saved = ckpt.load_trainer_state(directory)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # e.g. an adapter version's directory
            raise StateError(f"{directory} is not a learner checkpoint: its {ckpt.TRAINER_STATE} cannot be "
                             f"read ({type(exc).__name__}: {exc})") from exc
        if saved.run_id != run_id:
            raise StateError(f"checkpoint {directory} belongs to run {saved.run_id!r}, not {run_id!r}")
        wanted = config.adapter_fields()
        saved_lora = saved.config.get("lora") or {}
        have = {k: saved_lora.get(k) for k in wanted}
        if have != wanted:
            raise StateError(
                f"checkpoint {directory} was trained with {have}, the run config asks for {wanted}"
            )

    def _load(self, directory: Path, reset_on_error: bool) -> LearnerState:
        try:
            loaded = ckpt.read_checkpoint_tensors(directory, self.engine.trainable_shapes())
        except ValueError as exc:
            if reset_on_error:
                self._send(Command("reset"))
                self.engine.reset()
            raise StateError(f"cannot restore {directory}: {exc}") from exc
        self._send(Command("load", path=str(directory)))
        self._state_checkpoint = None
        state = self.engine.load_checkpoint(directory, loaded)
        self._state_checkpoint = directory
        log.info("restored checkpoint", extra={"path": str(directory), "step": state.step})
        return state


def _verify(checkpoint: Path) -> None:
    """Checks a checkpoint against its manifest; StateError when it is incomplete or altered."""
    try:
        storage.verify_manifest(checkpoint)
    except storage.ManifestError as exc:
        raise StateError(f"checkpoint {checkpoint} is incomplete or altered: {exc}") from exc


def split_minibatches(num_items: int, num_minibatches: int) -> list[list[int]]:
    """Contiguous, near-equal groups of indices in request order (at most one per item)."""
    count = min(num_minibatches, num_items)
    bounds = [round(j * num_items / count) for j in range(count + 1)]
    return [list(range(bounds[j], bounds[j + 1])) for j in range(count)]


def worker_loop(engine: LearnerEngine) -> None:
    """Ranks other than 0: run rank 0's commands until told to stop."""
    ctx = engine.ctx
    assert not ctx.is_main
    while True:
        command: Command = broadcast_object(None, ctx)
        if command.kind == "stop":
            return
        if command.kind == "configure":
            engine.configure(command.run_id, TrainSettings.from_json(command.config_json), command.version)
        elif command.kind == "train":
            shards = scatter_objects(None, ctx)
            minibatches = []
            for shard, totals in zip(shards, command.totals, strict=True):
                items = [prepare_trajectory(traj, engine.spec, engine.frames, engine.action_mask) for traj, _ in shard]
                minibatches.append(
                    MiniBatch(
                        [
                            item.as_padding() if pad else item
                            for item, (_, pad) in zip(items, shard, strict=True)
                        ],
                        totals,
                    )
                )
            engine.train(minibatches)
        elif command.kind == "publish":
            engine.publish(command.version)
        elif command.kind == "save":
            engine.save_checkpoint()
        elif command.kind == "load":
            engine.load_checkpoint(Path(command.path), None)
        elif command.kind == "reset":
            engine.reset()
        else:
            raise AssertionError(f"unknown command {command.kind!r}")
