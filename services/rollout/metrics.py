"""The rollout service's Prometheus metrics (`mmrl_rollout_*`).

vLLM's own metrics (`vllm:*`: requests running and waiting, prompt and generation tokens, KV-cache
use, prefix-cache queries and hits, time to first token, ...) are recorded by vLLM's
PrometheusStatLogger in this process's default registry when `RolloutConfig.engine_metrics` is on,
and served by the same `/metrics` endpoint under vLLM's own names.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

GENERATE_SECONDS = Histogram("mmrl_rollout_generate_seconds", "Time to answer one Generate call (all its requests)",
                             buckets=LATENCY_BUCKETS)
GENERATE_REQUESTS = Counter("mmrl_rollout_generate_requests", "Prompts generated for (requests of Generate calls)")
GENERATED_TOKENS = Counter("mmrl_rollout_generated_tokens", "Tokens generated over all completions")
ADAPTER_LOADS = Counter("mmrl_rollout_adapter_loads", "LoadAdapter calls answered OK (already loaded included)")
ADAPTER_LOAD_SECONDS = Histogram("mmrl_rollout_adapter_load_seconds",
                                 "Time to verify, copy and load one adapter version into the engine",
                                 buckets=LATENCY_BUCKETS)
ADAPTER_VERSION = Gauge("mmrl_rollout_adapter_version", "Newest adapter version loaded, per run", ["run_id"])
ADAPTER_PROBE_GAP = Gauge("mmrl_rollout_adapter_probe_gap",
                          "Mean absolute difference per probe token between this replica's and the learner's "
                          "log-probs under the newest adapter loaded, per run", ["run_id"])
_newest: dict[str, int] = {}
ERRORS = Counter("mmrl_rollout_errors", "Refused calls by method and gRPC status code", ["method", "code"])


def generated(seconds: float, num_requests: int, num_tokens: int) -> None:
    GENERATE_SECONDS.observe(seconds)
    GENERATE_REQUESTS.inc(num_requests)
    GENERATED_TOKENS.inc(num_tokens)


def adapter_loaded(run_id: str, version: int, load_ms: float) -> None:
    ADAPTER_LOADS.inc()
    ADAPTER_LOAD_SECONDS.observe(load_ms / 1000)
    _newest[run_id] = max(version, _newest.get(run_id, 0))  # a reload of an older version keeps the newest
    ADAPTER_VERSION.labels(run_id).set(_newest[run_id])


def adapter_probed(run_id: str, gap: float) -> None:
    ADAPTER_PROBE_GAP.labels(run_id).set(gap)
