"""The learner's Prometheus metrics (`mmrl_learner_*`), served by rank 0.

Gauges hold the newest train step's values; histograms the time of each train step, publish and
checkpoint. Memory is read at scrape time: the process's resident set, and on a GPU the memory torch
has allocated and reserved on each visible device.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import LATENCY_BUCKETS

TRAIN_STEP_SECONDS = Histogram("mmrl_learner_train_step_seconds", "Time of one TrainStep (all its mini-batches)",
                               buckets=LATENCY_BUCKETS)
TRAIN_STEPS = Counter("mmrl_learner_train_steps", "TrainStep calls completed")
TRAINED_TOKENS = Counter("mmrl_learner_trained_tokens", "Tokens trained on (prompt and generated)")
PUBLISH_SECONDS = Histogram("mmrl_learner_publish_seconds", "Time to publish one adapter version",
                            buckets=LATENCY_BUCKETS)
CHECKPOINT_SECONDS = Histogram("mmrl_learner_checkpoint_seconds", "Time to write one checkpoint",
                               buckets=LATENCY_BUCKETS)

# Newest step's values, by train-step metric key.
STEP_GAUGES = {
    "train/tokens_per_s": Gauge("mmrl_learner_tokens_per_second", "Tokens per second of the newest train step"),
    "train/loss": Gauge("mmrl_learner_loss", "Loss of the newest train step"),
    "train/grad_norm": Gauge("mmrl_learner_grad_norm", "Gradient norm (before clipping) of the newest train step"),
    "train/logprob_abs_diff_vs_rollout": Gauge(
        "mmrl_learner_logprob_abs_diff_vs_rollout",
        "Mean |learner - rollout| log-prob of the generated tokens in the newest train step"),
    "train/learning_rate": Gauge("mmrl_learner_learning_rate", "Learning rate of the newest train step"),
}


def trained(metrics: dict[str, float]) -> None:
    """Records one TrainStep from the metrics it returns."""
    TRAIN_STEPS.inc()
    TRAIN_STEP_SECONDS.observe(metrics.get("train/step_s", 0.0))
    TRAINED_TOKENS.inc(metrics.get("train/num_tokens", 0.0))
    for key, gauge in STEP_GAUGES.items():
        value = metrics.get(key)
        if value is not None and math.isfinite(value):  # a skipped step's loss is NaN: keep the last
            gauge.set(value)


def published(publish_ms: float) -> None:
    PUBLISH_SECONDS.observe(publish_ms / 1000)


def checkpointed(checkpoint_ms: float) -> None:
    if checkpoint_ms > 0:  # 0: the checkpoint was there already
        CHECKPOINT_SECONDS.observe(checkpoint_ms / 1000)


def _resident_bytes() -> float:
    try:
        with open("/proc/self/statm") as statm:
            return float(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak instead
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class MemoryCollector(Collector):
    """`mmrl_learner_memory_bytes` and, with CUDA, `mmrl_learner_gpu_memory_bytes{device,kind}`."""

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily("mmrl_learner_memory_bytes", "Resident memory of the learner process (rank 0)",
                                value=_resident_bytes())
        gpu = GaugeMetricFamily("mmrl_learner_gpu_memory_bytes", "GPU memory torch holds on each device",
                                labels=["device", "kind"])
        import torch

        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                gpu.add_metric([str(index), "allocated"], float(torch.cuda.memory_allocated(index)))
                gpu.add_metric([str(index), "reserved"], float(torch.cuda.memory_reserved(index)))
        yield gpu

    def describe(self) -> Iterator[Any]:
        yield GaugeMetricFamily("mmrl_learner_memory_bytes", "")
        yield GaugeMetricFamily("mmrl_learner_gpu_memory_bytes", "", labels=["device", "kind"])


REGISTRY.register(MemoryCollector())
