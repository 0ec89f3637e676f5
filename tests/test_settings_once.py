"""The training settings are defined once (services/common/training.py): the coordinator's run
config holds those very classes, the learner parses what the coordinator sends with them, and no
other settings model on either side of that boundary defines one of their fields again."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from pydantic import BaseModel

import services.coordinator
import services.learner
from services.common import training
from services.common.training import LoraSettings, LossSettings, OptimSettings, TrainSettings
from services.coordinator.config import RunConfig

SECTIONS = {"lora": LoraSettings, "optim": OptimSettings, "loss": LossSettings}


def _models_of(package: object) -> list[type[BaseModel]]:
    """Every pydantic model defined in the package's modules (the SFT's one-process settings aside:
    they never cross a service boundary)."""
    found = []
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):  # type: ignore[attr-defined]
        if info.name.endswith((".sft", ".gpu_check")):
            continue
        module = importlib.import_module(info.name)
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, BaseModel) and cls.__module__ == module.__name__]
    return found


def test_the_run_config_holds_the_shared_training_classes() -> None:
    for name, cls in SECTIONS.items():
        assert RunConfig.model_fields[name].annotation is cls, name


def test_what_the_coordinator_sends_is_what_the_learner_parses_with_the_same_defaults() -> None:
    sent = RunConfig(model="m").train_settings()
    assert TrainSettings.from_json(sent.model_dump_json()) == sent
    # A client that sends nothing gets exactly the run config's defaults.
    assert TrainSettings.from_json("{}").model_dump(exclude={"seed", "total_steps"}) == \
        sent.model_dump(exclude={"seed", "total_steps"})


def test_no_other_settings_model_redefines_a_training_setting() -> None:
    shared = {f for cls in SECTIONS.values() for f in cls.model_fields}
    shared_classes = {cls for _, cls in inspect.getmembers(training, inspect.isclass)}
    for model in _models_of(services.coordinator) + _models_of(services.learner):
        if model in shared_classes:
            continue
        again = shared & set(model.model_fields)
        assert not again, f"{model.__module__}.{model.__name__} defines {sorted(again)} again"
