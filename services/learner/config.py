"""The learner's typed configuration.

`LearnerRunConfig` holds one run's training settings (LoRA, optimiser, GRPO loss); it arrives as
JSON in `ConfigureRun` and is written next to the run's outputs. `LearnerSettings` holds the
process settings of `mmrl serve learner`, from environment variables prefixed `MMRL_LEARNER_`
(e.g. MMRL_LEARNER_PORT=50053) and `MMRL_SHARED_ROOT`, overridden by command-line flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Every linear layer of the language model's decoder layers; the vision tower and its merger
# are not adapted (vLLM applies LoRA to the language model only).
DEFAULT_LORA_TARGETS = (
    r".*language_model\.layers\.\d+\."
    r"(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"
)


class LearnerRunConfig(BaseModel):
    """Training settings of one run (the `config_json` of ConfigureRun)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    lora_rank: int = Field(default=16, ge=1, le=256)
    """LoRA rank r (the rollout engine's max_lora_rank must be at least this)."""
    lora_alpha: int = Field(default=32, ge=1, le=4096)
    """LoRA scaling numerator: the update is (alpha / r) * B @ A."""
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the LoRA input during training (0 keeps learner and engine log-probs identical)."""
    lora_target_modules: str = Field(default=DEFAULT_LORA_TARGETS, min_length=1)
    """Regular expression (peft full-match) over module names selecting the adapted linear layers;
    the default covers the language model's attention and MLP projections only."""
    learning_rate: float = Field(default=5e-5, gt=0, le=1)
    """Peak AdamW learning rate (reached after the warm-up)."""
    warmup_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Steps of linear warm-up from learning_rate / (warmup_steps + 1) to learning_rate."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: constant, or cosine decay to min_lr_ratio * learning_rate at total_steps."""
    total_steps: int | None = Field(default=None, ge=1)
    """Length of the cosine schedule in optimiser steps (required for lr_schedule='cosine')."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Final learning rate of the cosine schedule as a fraction of learning_rate."""
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    """AdamW decoupled weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2), each in [0, 1)."""
    adam_eps: float = Field(default=1e-8, gt=0, le=1e-2)
    """AdamW epsilon."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global L2 norm before the optimiser step."""
    num_minibatches: int = Field(default=1, ge=1, le=1024)
    """Optimiser steps per TrainStep: the batch is split into this many mini-batches (in request
    order), one step each, in each of `num_epochs` passes. With 1 (and one epoch) the step is plain
    on-policy GRPO (the PPO ratio is 1); later steps are off-policy and the clipped ratio against
    the pre-step log-probs applies."""
    num_epochs: int = Field(default=1, ge=1, le=64)
    """Passes over the batch per TrainStep (PPO epochs): every pass takes one optimiser step per
    mini-batch, so a TrainStep takes num_epochs x num_minibatches steps, all against the old
    log-probs of the batch from before the first one."""
    micro_batch_size: int = Field(default=8, ge=1, le=4096)
    """Trajectories per forward/backward on each rank; gradients accumulate over micro-batches, so
    any batch size fits memory and the result does not depend on this value."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input in the forward pass and recompute the layer in the
    backward pass (non-reentrant torch checkpointing): activation memory of a micro-batch drops from
    every layer's intermediates to one layer's, for about one more forward pass of time. The loss
    and gradients are the same."""
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower PPO clip: the ratio is clipped below at 1 - clip_low."""
    clip_high: float = Field(default=0.28, ge=0, le=10)
    """Upper PPO clip: the ratio is clipped above at 1 + clip_high (DAPO clip-higher: 0.28; 0.2 is
    the symmetric PPO clip)."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the k3 KL estimate to the reference policy (the base model, adapter disabled);
    0 skips the reference forward pass."""
    loss_agg: Literal["token_mean", "sequence_mean"] = "token_mean"
    """How per-token losses are averaged over the whole batch: over all generated tokens
    (token_mean, DAPO) or per trajectory first, then over trajectories (sequence_mean, GRPO)."""
    tis_cap: float | None = Field(default=None, gt=0)
    """Truncated importance sampling: weight each token's loss by min(pi_learner / pi_rollout,
    tis_cap) to correct for rollout-engine/learner mismatch; None disables it."""
    old_logprobs: Literal["learner", "rollout"] = "learner"
    """The "old" policy of the PPO ratio with several mini-batches: the learner's log-probs before
    the TrainStep's first update (a no-grad pass over the later mini-batches), or the rollout
    engine's, which skips that pass. 'rollout' is exact only when the engine computes what the
    learner does (check train/logprob_abs_diff_vs_rollout) and the batch was sampled by the
    learner's current version (not with async_rollout)."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """Seed of the LoRA initialisation and of every rank's random number generators."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam_betas must lie in [0, 1), got {self.adam_betas}")
        if self.lr_schedule == "cosine" and self.total_steps is None:
            raise ValueError("lr_schedule 'cosine' needs total_steps")
        if self.total_steps is not None and self.total_steps <= self.warmup_steps:
            raise ValueError(f"total_steps {self.total_steps} must exceed warmup_steps {self.warmup_steps}")
        return self

    @classmethod
    def from_json(cls, text: str) -> LearnerRunConfig:
        """Parses ConfigureRun's config_json ("" or "{}" means all defaults); raises ValueError."""
        return cls.model_validate_json(text.strip() or "{}")

    def adapter_fields(self) -> dict[str, object]:
        """The settings that fix the adapter's tensors and what they compute (its scale alpha / r): a
        checkpoint only loads when they agree, else the restored policy would not be the saved one."""
        return {"lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                "lora_target_modules": self.lora_target_modules}


class LearnerSettings(BaseSettings):
    """Process settings of `mmrl serve learner` (environment MMRL_LEARNER_*, flags override)."""

    model_config = SettingsConfigDict(
        env_prefix="MMRL_LEARNER_", extra="forbid", use_attribute_docstrings=True, populate_by_name=True
    )

    model: Path = Path("models/tiny")
    """Hugging Face model directory (MMRL_LEARNER_MODEL), e.g. from `mmrl init-model tiny`."""
    shared_root: Path = Field(
        default=Path("shared"), validation_alias=AliasChoices("MMRL_SHARED_ROOT", "shared_root")
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
