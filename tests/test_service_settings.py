"""Deployment settings read from the environment: the variables compose and Kubernetes set."""

from __future__ import annotations

import pytest

from services.env.config import ServerSettings as EnvServerSettings
from services.learner.config import LearnerSettings
from services.rollout.config import ServerSettings as RolloutServerSettings


def test_every_service_reads_the_shared_log_level_and_its_own_one_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMRL_LOG_LEVEL", "DEBUG")  # what docker-compose.yml and the k8s ConfigMap set
    assert [s().log_level for s in (EnvServerSettings, RolloutServerSettings, LearnerSettings)] == ["DEBUG"] * 3
    monkeypatch.setenv("MMRL_ROLLOUT_LOG_LEVEL", "WARNING")
    assert RolloutServerSettings().log_level == "WARNING"
    assert EnvServerSettings(log_level="ERROR").log_level == "ERROR"
