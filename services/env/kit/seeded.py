"""`SeedRangeEnv`: an environment whose task is its seed, nothing to reserve beyond the seed range (a
Gymnasium env reset with the seed, an OpenEnv server's episode).

Training tasks are distinct seeds drawn below TRAIN_SEED_LIMIT, options passed on; the one eval set
(`eval_set_name`, v1) is the first `num_eval_tasks` seeds from EVAL_SEED_MIN at `eval_max_moves`, its
content hash over each task's first observation (text and frame digest).
"""

from __future__ import annotations

import functools
import hashlib

from services.common.task import TaskSpec
from services.env.kit.batched import BatchedEnv, E, Prepared, named_eval_set
from services.env.kit.evalset import EvalSet, hash_tasks
from services.env.kit.seeds import EVAL_SEED_MIN, draw_training_seeds


class SeedRangeEnv(BatchedEnv[Prepared, E]):
    eval_set_name = ""
    num_eval_tasks = 64
    eval_max_moves = 0

    def training_tasks(self, seed: str, count: int, max_moves: int, options: dict[str, str]) -> list[TaskSpec]:
        """`count` distinct training seeds drawn from `seed`, below the range reserved for eval sets."""
        self.check_count(count)
        self._prepare(TaskSpec(seed=0, max_moves=max_moves, options=dict(options)), "request")
        return [TaskSpec(seed=s, max_moves=max_moves, options=dict(options))
                for s in draw_training_seeds(seed, count, reserved=lambda s: False)]

    def eval_set(self, name: str = "") -> EvalSet:
        return named_eval_set(self._eval_set, name)

    @functools.cache  # noqa: B019 - one env object per server; its eval set is made once
    def _eval_set(self, name: str) -> EvalSet:
        if name not in ("", self.eval_set_name):
            raise KeyError(f"unknown eval set {name!r} (known: {self.eval_set_name})")
        specs = tuple(TaskSpec(seed=EVAL_SEED_MIN + i, max_moves=self.eval_max_moves)
                      for i in range(self.num_eval_tasks))
        return EvalSet(self.eval_set_name, "v1", hash_tasks(specs, self._first_observation), specs)

    def _first_observation(self, spec: TaskSpec) -> str:
        """What a task shows first: the content an eval set's hash covers."""
        episode = self._start(self._prepare(spec, "spec"))
        try:
            return hashlib.sha256(episode.frame()).hexdigest() + " " + episode.text()
        finally:
            self._discard(episode)

    def _discard(self, episode: E) -> None:
        """Frees an episode that was never stored (e.g. closes its env)."""
