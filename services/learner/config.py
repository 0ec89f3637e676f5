"""The learner's typed configuration.

One run's training settings are `services.common.training.TrainSettings` (the coordinator's run
config sends them as JSON in `ConfigureRun`; they are written next to the run's outputs). This
module's `LearnerSettings` holds the
process settings of `mmrl serve learner`, from environment variables prefixed `MMRL_LEARNER_`
(e.g. MMRL_LEARNER_PORT=50053) and `MMRL_SHARED_ROOT`, overridden by command-line flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.storage import DEFAULT_SHARED_ROOT
from services.common.tracing import TracingMode


class LearnerSettings(BaseSettings):
    """Process settings of `mmrl serve learner` (environment MMRL_LEARNER_*, flags override)."""

    model_config = SettingsConfigDict(
        env_prefix="MMRL_LEARNER_", extra="forbid", use_attribute_docstrings=True, populate_by_name=True
    )

    model: Path = Path("models/tiny")
    """Hugging Face model directory (MMRL_LEARNER_MODEL), e.g. from `mmrl init-model tiny`."""
    shared_root: Path = Field(
        default=DEFAULT_SHARED_ROOT, validation_alias=AliasChoices("MMRL_SHARED_ROOT", "shared_root")
    )
    """Root of the shared storage holding runs/<run_id>/{adapters,checkpoints} (MMRL_SHARED_ROOT)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train (auto: cuda when available); each rank uses cuda:<local rank>."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: FSDP2 gathers parameters in it and reduces gradients in float32 (auto:
    float32 on CPU, bfloat16 on GPU). Stored weights, LoRA weights and the optimiser state stay
    float32."""
    replicate_base: bool = False
    """Keep the whole frozen base model on every rank (MMRL_LEARNER_REPLICATE_BASE): FSDP2 then
    shards only the LoRA weights and never gathers the base, at the cost of the base's full size in
    compute dtype per device (16 GB for an 8B model in bfloat16: the usual choice on 80-141 GB GPUs).
    Off: the base is sharded too and gathered block by block in every forward and backward."""
    host: str = "0.0.0.0"
    """Address rank 0 listens on (MMRL_LEARNER_HOST)."""
    port: int = Field(default=50053, ge=0, le=65535)
    """gRPC port of rank 0 (MMRL_LEARNER_PORT; 0 picks a free one)."""
    num_threads: int | None = Field(default=None, ge=1, le=1024)
    """CPU threads per rank for torch (MMRL_LEARNER_NUM_THREADS); None keeps torch's default
    (torchrun sets OMP_NUM_THREADS=1 per rank). On a shared CPU one thread avoids oversubscription."""
    image_cache_mb: int = Field(default=1024, ge=0, le=1 << 20)
    """Memory for the frozen vision tower's outputs, kept per distinct frame across steps so that the
    tower runs once per frame (MMRL_LEARNER_IMAGE_CACHE_MB; 0: off). Used on an unsharded learner
    whose adapter leaves the vision tower alone (services/learner/image_features.py)."""
    log_level: str = Field(
        default="INFO", validation_alias=AliasChoices("MMRL_LEARNER_LOG_LEVEL", "MMRL_LOG_LEVEL", "log_level")
    )
    """Logging level (MMRL_LEARNER_LOG_LEVEL, else MMRL_LOG_LEVEL, which every service reads)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the Prometheus /metrics HTTP endpoint (MMRL_LEARNER_METRICS_PORT); 0: not served."""
    tracing: TracingMode = Field(
        default="off", validation_alias=AliasChoices("MMRL_LEARNER_TRACING", "MMRL_TRACING", "tracing"))
    """OpenTelemetry tracing: off, otlp (OTEL_EXPORTER_OTLP_* variables) or console (MMRL_LEARNER_TRACING,
    else MMRL_TRACING)."""
