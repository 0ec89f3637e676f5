"""Environments by name: a throwaway environment built on the env kit is added through the registry in a
few lines, served by the env service's own servicer, and passes every check of `mmrl env check`."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from services.common.task import TaskSpec
from services.env import registry
from services.env.config import EnvConfig
from services.env.kit.batched import BatchedEnv, EnvInfo, named_eval_set
from services.env.kit.evalset import EvalSet, hash_tasks
from services.env.kit.seeds import EVAL_SEED_MIN, draw_training_seeds
from services.env.kit.spec import SpecLike, check_max_moves, check_options_and_seed
from services.env.servicer import EnvServicer


class Corridor:
    """A row of 3-6 cells (by seed): walk right from the left end to the right end."""

    def __init__(self, spec: SpecLike) -> None:
        self.length, self.budget = 3 + spec.seed % 4, spec.max_moves or 10
        self.cell = self.moves = 0
        self.done = self.truncated = False
        self.reward = 0.0
        self.static_info: tuple[tuple[str, Any], ...] = (("length", self.length),)

    def step(self, text: str) -> None:
        self.moves += 1
        self.cell = max(0, min(self.length - 1, self.cell + {"right": 1, "left": -1}.get(text.strip(), 0)))
        self.reward = float(self.cell == self.length - 1)
        self.done = self.reward > 0 or self.moves >= self.budget
        self.truncated = self.done and self.reward == 0

    def text(self) -> str:
        return f"Moves left: {self.budget - self.moves}."

    def frame(self) -> bytes:
        image = Image.new("L", (16 * self.length, 16), 255)
        image.paste(0, (16 * self.cell, 0, 16 * self.cell + 16, 16))
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()

    def state_key(self) -> str:
        return f"corridor/{self.length}/{self.cell}"

    def dynamic_info(self) -> dict[str, Any]:
        return {"solved": self.reward > 0, "optimal_action": "right"}


class CorridorEnv(BatchedEnv[SpecLike, Corridor]):
    INFO = EnvInfo(name="corridor", actions=("right", "left"), capabilities=("state_keys", "oracle"),
                   eval_sets=("corridor-8",))

    def _prepare(self, spec: SpecLike, where: str) -> SpecLike:
        check_options_and_seed(spec, (), where)
        check_max_moves(spec, self.config.max_max_moves, where)
        return spec

    def _start(self, prepared: SpecLike) -> Corridor:
        return Corridor(prepared)

    def training_tasks(self, seed: str, count: int, max_moves: int, options: dict[str, str]) -> list[TaskSpec]:
        self.check_count(count)
        self._prepare(TaskSpec(0, max_moves, options), "request")  # the budget and options, checked
        return [TaskSpec(s, max_moves) for s in draw_training_seeds(seed, count, reserved=lambda s: False)]

    def eval_set(self, name: str = "") -> EvalSet:
        def corridor_8(name: str) -> EvalSet:
            if name not in ("", "corridor-8"):
                raise KeyError(f"unknown eval set {name!r}")
            specs = tuple(TaskSpec(EVAL_SEED_MIN + i, 10) for i in range(8))
            return EvalSet("corridor-8", "v1", hash_tasks(specs, lambda spec: str(spec.seed)), specs)

        return named_eval_set(corridor_8, name)


@pytest.fixture
def corridor() -> Any:
    registry.register("corridor", CorridorEnv)
    yield
    del registry.ENVIRONMENTS["corridor"]


async def test_an_environment_added_through_the_registry_passes_every_check(corridor: None) -> None:
    from mmrl.envcheck.runner import CHECK_NAMES, run_checks, table
    from tests.envcheck.test_env_check import serving

    assert "corridor" in registry.names()
    async with serving(EnvServicer(registry.create("corridor", EnvConfig()))) as address:
        results = await run_checks(address)
    assert [r.name for r in results] == CHECK_NAMES
    assert all(r.passed for r in results), table(results)


def test_a_name_is_registered_once_and_an_unknown_one_is_refused_naming_the_known(corridor: None) -> None:
    with pytest.raises(ValueError, match="taken"):
        registry.register("corridor", CorridorEnv)
    with pytest.raises(ValueError, match=r"unknown environment 'hallway' \(known: maze, sokoban, corridor\)"):
        registry.create("hallway", EnvConfig())


def test_the_shipped_environments_are_registered_and_serve_by_name() -> None:
    from services.env.config import ServerSettings

    assert registry.names()[:2] == ("maze", "sokoban")
    for name in registry.names():
        assert registry.create(name, EnvConfig()).info().name == name
    assert ServerSettings(env="sokoban").env == "sokoban"
