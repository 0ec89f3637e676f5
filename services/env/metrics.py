"""The env service's Prometheus metrics (`mmrl_env_*`), recorded around every EnvService call."""

from __future__ import annotations

import time
from collections.abc import Callable, Sized
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS
from services.env.errors import EnvError

T = TypeVar("T")

EPISODES_CREATED = Counter("mmrl_env_episodes_created", "Episodes created (CreateEpisodes)")
STEPS = Counter("mmrl_env_steps", "Actions applied: one per episode of each Step call")
STEP_SECONDS = Histogram("mmrl_env_step_seconds", "Time to apply one Step call's actions and render the frames",
                         buckets=LATENCY_BUCKETS)
ACTIVE_EPISODES = Gauge("mmrl_env_active_episodes", "Episodes alive (created, not closed or expired)")
ERRORS = Counter("mmrl_env_errors", "Refused calls by method and gRPC status code", ["method", "code"])

_COUNTED = {"CreateEpisodes": EPISODES_CREATED, "Step": STEPS}


def observe(method: str, operation: Callable[[], T]) -> T:
    """Runs one call's `operation`, recording what it did (or the code it was refused with)."""
    start = time.perf_counter()
    try:
        result = operation()
    except EnvError as error:
        ERRORS.labels(method, error.code.name).inc()
        raise
    if method == "Step":
        STEP_SECONDS.observe(time.perf_counter() - start)
    counter = _COUNTED.get(method)
    if counter is not None and isinstance(result, Sized):
        counter.inc(len(result))
    return result


def track_live_episodes(count: Callable[[], int]) -> None:
    """`mmrl_env_active_episodes` reads `count()` at each scrape."""
    ACTIVE_EPISODES.set_function(count)
