"""The coordinator's Prometheus metrics, served on its REST port at `/metrics`.

Two sources: the run store, read at scrape time (run states and each run's newest step and eval, so
a restarted coordinator reports runs it has not driven yet), and this process's registry, fed as steps
and evals are recorded (`record_step`, `record_eval`: phase-time histograms, step counters) plus the
gRPC client metrics of its calls to the services (`mmrl_grpc_client_*`: service errors).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.common.metrics import LATENCY_BUCKETS
from services.coordinator.ops.store import RunState, RunStore

PHASES = ("rollout", "env", "train", "sync", "step")
"""Step timers recorded as `time/<phase>_s` in a step's metrics; evals add the phase "eval"."""

PHASE_SECONDS = Histogram("mmrl_run_phase_seconds", "Wall-clock seconds of one step's phase (rollout: "
                          "Generate calls, env: env calls, train: TrainStep, sync: publish and adapter loads, "
                          "step: the whole step; eval: one evaluation)", ["run_id", "phase"], buckets=LATENCY_BUCKETS)
STEPS_RECORDED = Counter("mmrl_run_steps_recorded", "Steps this coordinator recorded", ["run_id"])
EVALS_RECORDED = Counter("mmrl_run_evals_recorded", "Evals this coordinator recorded", ["run_id"])


def record_step(run_id: str, metrics: dict[str, Any]) -> None:
    STEPS_RECORDED.labels(run_id).inc()
    for phase in PHASES:
        value = metrics.get(f"time/{phase}_s")
        if isinstance(value, int | float):
            PHASE_SECONDS.labels(run_id, phase).observe(value)


def record_eval(run_id: str, summary: dict[str, Any]) -> None:
    EVALS_RECORDED.labels(run_id).inc()
    if isinstance(summary.get("eval_s"), int | float):
        PHASE_SECONDS.labels(run_id, "eval").observe(summary["eval_s"])


# Scrape-time gauges: (name, help, where the value comes from: "step" metrics or "eval" summary, key).
RUN_GAUGES = (
    ("mmrl_run_reward_mean", "Mean reward of the newest step", "step", "reward/mean"),
    ("mmrl_run_train_solve_rate", "Share of the newest step's trained-on episodes solved", "step", "train/solve_rate"),
    ("mmrl_run_played_solve_rate", "Share of every episode the newest step played solved, dropped groups too",
     "step", "episodes/played_solve_rate"),
    ("mmrl_run_eval_greedy_solve_rate", "Greedy solve rate of the newest eval", "eval", "greedy_solve_rate"),
    ("mmrl_run_eval_sampled_solve_rate", "Sampled solve rate of the newest eval", "eval", "sampled_solve_rate"),
)


async def render(store: RunStore) -> bytes:
    """The Prometheus text of the store's runs and of this process's registry."""
    registry = CollectorRegistry()
    runs_by_state = Gauge("mmrl_runs", "Runs by state", ["state"], registry=registry)
    step = Gauge("mmrl_run_step", "Steps completed", ["run_id"], registry=registry)
    gauges = [(Gauge(name, doc, ["run_id"], registry=registry), source, key) for name, doc, source, key in RUN_GAUGES]
    counts = dict.fromkeys((s.value for s in RunState), 0)
    if await store.ping():
        for run in await store.list_runs():
            counts[run["state"]] += 1
            step.labels(run["id"]).set(run["step"])
            if run["state"] not in (RunState.RUNNING, RunState.PAUSED):
                continue
            newest = {"step": (await store.metrics(run["id"]) or [{}])[-1],
                      "eval": (await store.evals(run["id"]) or [{}])[-1]}
            for gauge, source, key in gauges:
                value = newest[source].get(key)
                if isinstance(value, int | float):
                    gauge.labels(run["id"]).set(value)
    for state, count in counts.items():
        runs_by_state.labels(state).set(count)
    return generate_latest(registry) + generate_latest(REGISTRY)
