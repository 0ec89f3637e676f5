"""AdamW over the LoRA weights and the learning-rate schedule (a pure function of the step, so
the scheduler's whole state is the step counter saved in every checkpoint)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pydantic is not needed to train (the GPU check runs without it)
    from services.common.training import TrainSettings


def learning_rate_at(step: int, config: TrainSettings) -> float:
    """The learning rate of optimiser step `step` (0-based):

        warm-up  (step < W):  lr * (step + 1) / (W + 1)
        constant (after):     lr
        cosine   (after):     lr * (m + (1 - m) * (1 + cos(pi * p)) / 2),  p = (step - W) / (T - W)

    with W = warmup_steps, T = total_steps, m = min_lr_ratio; p is capped at 1.
    """
    peak = config.optim.learning_rate
    warmup = config.optim.warmup_steps
    if step < warmup:
        return peak * (step + 1) / (warmup + 1)
    if config.optim.lr_schedule == "constant":
        return peak
    assert config.total_steps is not None
    progress = min(1.0, (step - warmup) / (config.total_steps - warmup))
    floor = config.optim.min_lr_ratio
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def build_optimizer(params: Iterable[torch.nn.Parameter], config: TrainSettings) -> torch.optim.AdamW:
    """AdamW on the trainable parameters; its lr is set by the trainer before every step."""
    return torch.optim.AdamW(
        list(params),
        lr=learning_rate_at(0, config),
        betas=config.optim.adam_betas,
        eps=config.optim.adam_eps,
        weight_decay=config.optim.weight_decay,
        foreach=False,
    )


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
