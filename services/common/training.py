"""The training settings of a run: LoRA, optimiser and loss, defined once.

The coordinator's run config holds them as its `lora`, `optim` and `loss` sections and sends
`TrainSettings` to the learner as JSON (ConfigureRun's `config_json`); the learner parses the same
model. One class per concept on both sides of the boundary, so there is one default for each
setting (tests/test_settings_once.py).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Every linear layer of the language model's decoder layers; the vision tower and its mergers stay
# frozen (the learner then caches their outputs per frame; the rollout needs no tower LoRA).
DEFAULT_LORA_TARGETS = (
    r".*language_model\.layers\.\d+\."
    r"(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"
)
# The same plus every linear layer of Qwen3-VL's vision tower and its mergers (not the Conv3d patch
# embedding): LoRA that also trains the frame's reading; the rollout service serves it with tower_lora.
TOWER_LORA_TARGETS = (
    rf"(?:{DEFAULT_LORA_TARGETS})"
    r"|.*visual\.(blocks\.\d+\.(attn\.(qkv|proj)|mlp\.linear_fc[12])|(merger|deepstack_merger_list\.\d+)\.linear_fc[12])"
)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LoraSettings(_Settings):
    """LoRA on the language model's linear layers."""

    rank: int = Field(16, ge=1, le=256, description="LoRA rank r (the rollout engine's max_lora_rank must be "
                                                    "at least this).")
    alpha: int = Field(32, ge=1, le=4096, description="LoRA alpha: the update is (alpha / r) * B @ A.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input during training (0 keeps "
                                                           "learner and engine log-probs identical).")
    target_modules: str = Field(
        DEFAULT_LORA_TARGETS, min_length=1,
        description="Regular expression (peft full match) over module names selecting the adapted linear "
                    "layers; the default is the language model's attention and MLP projections. Layers of "
                    "the vision tower or its mergers may be selected too: the rollout service then needs "
                    "tower_lora.",
    )


class OptimSettings(_Settings):
    """AdamW with linear warm-up, then a constant or cosine-decaying learning rate."""

    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate (after the warm-up).")
    warmup_steps: int = Field(0, ge=0, le=1_000_000, description="Linear warm-up from learning_rate / "
                                                                 "(warmup_steps + 1), in optimiser steps.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="After the warm-up: constant, or cosine decay over the run's optimiser steps."
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Cosine: final learning rate as a fraction "
                                                                 "of the peak.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW decoupled weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1).")
    adam_eps: float = Field(1e-8, gt=0.0, le=1e-2, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradients are clipped to this global L2 norm.")
    micro_batch_size: int = Field(
        16, ge=1, le=4096,
        description="Distinct sequences per forward/backward on each rank (trajectories the model sees as the "
                    "same tokens and images share one row); gradients accumulate over micro-batches, so the "
                    "result does not depend on it, only memory and speed do.",
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer in the backward pass: far less activation memory "
                           "for long multi-turn trajectories, about one more forward pass of time.",
    )
    num_minibatches: int = Field(
        1, ge=1, le=1024,
        description="Optimiser steps per pass over a training step's batch (split in request order): "
                    "num_minibatches x epochs optimiser steps per step (1 x 1 = plain on-policy GRPO).",
    )
    epochs: int = Field(
        1, ge=1, le=64,
        description="Passes over each training step's batch (PPO epochs), all against the old log-probs "
                    "from before the first optimiser step.",
    )

    @model_validator(mode="after")
    def _betas(self) -> Self:
        if not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam_betas must lie in [0, 1), got {self.adam_betas}")
        return self

    @property
    def steps_per_train_step(self) -> int:
        return self.num_minibatches * self.epochs


class LossSettings(_Settings):
    """The clipped surrogate loss the learner minimises (services/learner/loss.py)."""

    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="Lower PPO clip: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0.0, le=10.0, description="Upper PPO clip: ratio <= 1 + clip_high "
                                                                "(DAPO clip-higher 0.28; 0.2 is symmetric).")
    kl_coef: float = Field(0.0, ge=0.0, le=100.0, description="Weight of the k3 KL to the reference policy "
                                                              "(the adapter disabled); 0 skips that pass.")
    entropy_coef: float = Field(
        0.0, ge=0.0, le=10.0,
        description="Weight of the entropy bonus: minus this times the entropy of each generated token's "
                    "distribution (over the allowed tokens with constrained actions, the whole vocabulary "
                    "otherwise) is added to its loss, so the policy keeps exploring; 0 = off.",
    )
    loss_agg: Literal["token_mean", "sequence_mean"] = Field(
        "token_mean", description="Average over all generated tokens (token_mean, DAPO) or per trajectory "
                                  "first, then over trajectories (sequence_mean, GRPO).",
    )
    tis_cap: float | None = Field(
        None, gt=0.0, description="Truncated importance sampling: weight each token's loss by "
                                  "min(pi_learner / pi_rollout, tis_cap); None = off.",
    )
    old_logprobs: Literal["learner", "rollout"] = Field(
        "learner",
        description="Old policy of the PPO ratio over several mini-batches: the learner's log-probs (an "
                    "extra no-grad pass) or the rollout engine's (exact only when they agree, see "
                    "train/logprob_abs_diff_vs_rollout, and not with async_rollout).",
    )


class TrainSettings(_Settings):
    """What the learner trains one run with: sent as is in ConfigureRun."""

    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA settings.")  # type: ignore[arg-type]
    optim: OptimSettings = Field(default_factory=OptimSettings, description="Optimiser settings.")  # type: ignore[arg-type]
    loss: LossSettings = Field(default_factory=LossSettings, description="Loss settings.")  # type: ignore[arg-type]
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the LoRA initialisation and of every "
                                                         "rank's random number generators.")
    total_steps: int | None = Field(None, ge=1, description="Optimiser steps of the whole run: the length "
                                                            "of the cosine schedule (required for it).")
    action_sequences: tuple[tuple[int, ...], ...] = Field(
        (), description="Constrained actions (sampling.actions): each action word's token ids and the "
                        "end-of-turn token; every log-prob is renormalised over the tokens they allow "
                        "(services/common/constrained.py). Empty: free text.")

    @model_validator(mode="after")
    def _schedule(self) -> Self:
        if self.optim.lr_schedule == "cosine" and self.total_steps is None:
            raise ValueError("lr_schedule 'cosine' needs total_steps")
        if self.total_steps is not None and self.total_steps <= self.optim.warmup_steps:
            raise ValueError(f"total_steps {self.total_steps} must exceed warmup_steps {self.optim.warmup_steps}")
        return self

    @classmethod
    def from_json(cls, text: str) -> TrainSettings:
        """Parses ConfigureRun's config_json ("" or "{}" means all defaults); raises ValueError."""
        return cls.model_validate_json(text.strip() or "{}")

    def adapter_fields(self) -> dict[str, object]:
        """The settings that fix the adapter's tensors and what they compute (its scale alpha / r): a
        checkpoint only loads when they agree, else the restored policy would not be the saved one."""
        return {"rank": self.lora.rank, "alpha": self.lora.alpha, "target_modules": self.lora.target_modules}
