"""`mmrl sft --config FILE` settings: one pydantic model, its optimiser the training settings' own.

The expert plays `num_tasks` training tasks the env service draws (GetTrainingTasks from the SFT's
seed, never an eval-set task) with the config's `options`; with checks, `check_tasks` more tasks of
the same draw (so distinct from every trained one) are the validation tasks the checks play.

A start of a chosen strength (`band`). GRPO wants a partly trained start, and a fixed number of
updates does not give the same start on every machine: floating-point sums differ between CPUs, the
runs drift apart, and past the steep part of the learning curve neighbouring checkpoints differ by up
to 0.2. With `band: [low, high]`, every `check_every` updates from `check_from` on, a checkpoint's
greedy solve rate on the validation tasks is measured; after all `updates` the SFT keeps the last
checkpoint whose check lies in the band (the most imitation a start of that strength can have), or,
when none does, the one whose check lies nearest to it. With `check_samples: k` each check also plays k
episodes per validation task at temperature 1 (the policy GRPO samples from) and records their solve
rate; `band_on: sampled` applies the band to that rate instead of the greedy one. Where the rate
rises late and fast (Sokoban's SFT reads the room after a plateau whose length varies from run to
run), `stop_above_band` ends the SFT at the first check above the band, so `updates` is a ceiling
rather than a budget that must fit every machine.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.common.conversation import DEFAULT_SYSTEM_PROMPT
from services.common.training import LoraSettings, OptimSettings

# Part of the fingerprint: bumped when the same config builds other data. 3: every environment's tasks
# come from GetTrainingTasks (the maze's too), validation tasks from the same draw.
SFT_DATA_VERSION = 3
RENAMED = {"num_mazes": "num_tasks", "check_mazes": "check_tasks", "learning_rate": "optim.learning_rate",
           "warmup_steps": "optim.warmup_steps", "weight_decay": "optim.weight_decay",
           "max_grad_norm": "optim.max_grad_norm", "micro_batch_size": "optim.micro_batch_size",
           "stop_above": "band", "keep": "band"}
BandOn = Literal["greedy", "sampled"]


class SftConfig(BaseModel):
    """`mmrl sft --config FILE` settings."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = Field(..., description="HF model directory to fine-tune.")
    out: str = Field(..., description="Output model directory (standard HF layout).")
    env: str = Field(
        "", max_length=100,
        description="The environment the expert plays, by its GetEnvInfo name ('' = whatever the env service "
                    "is); it needs the 'oracle' capability (info.optimal_action).")
    options: dict[str, str] = Field(
        default_factory=dict, description="Environment settings of every task (must match the GRPO run's "
                                          "env.options, e.g. the maze's size).")
    max_moves: int = Field(20, ge=1, description="Move budget of each expert episode.")
    num_tasks: int = Field(2000, ge=1, description="Training tasks the expert plays.")
    perturb_prob: float = Field(0.0, ge=0.0, lt=1.0, description="Chance of an untrained random move per turn.")
    detour_moves: int = Field(
        1, ge=1, le=20, description="A detour lasts 1..detour_moves random moves (longer ones lead into dead ends)."
    )
    updates: int = Field(300, ge=0, description="Optimiser updates on expert conversations (the SFT budget).")
    batch_size: int = Field(16, ge=1, description="Conversations per update.")
    optim: OptimSettings = Field(
        default_factory=lambda: OptimSettings(learning_rate=1e-3, warmup_steps=20),
        description="AdamW, warm-up and schedule (the training settings' model; lr_schedule cosine decays "
                    "over `updates`); micro_batch_size is conversations per forward/backward.")
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, description="System turn (must match the GRPO runs).")
    history_window: int | None = Field(
        None, ge=0, le=1000,
        description="Answered turns each prompt keeps (must match the GRPO runs): None = the whole conversation, "
                    "one training conversation per episode; k = one per turn, with the last k turns as context.")
    seed: int = Field(0, ge=0, description="Seed of the task draw, data perturbation, shuffling and dropout.")
    finetune: Literal["full", "lora"] = Field(
        "full", description="full: every weight trains. lora: a LoRA adapter (`lora`) on the frozen base, merged "
                            "into the saved model; sharded, no rank holds the whole base (the way to warm-start an "
                            "8B model). mmrl/sft/ranks.py.")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA settings with finetune: lora.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute dtype: auto is bfloat16 on GPU, float32 on CPU. Below float32 the model is "
                            "sharded with FSDP2 mixed precision (trained weights and AdamW state stay float32).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where the ranks train (auto: CUDA when "
                                                                       "present).")
    save_at: list[int] = Field(
        default_factory=list, description="Also save intermediate checkpoints at these updates (<out>-u<N>)."
    )
    band: tuple[float, float] | None = Field(
        None, description="[low, high]: the validation greedy solve rate of the start to keep (module docstring); "
                          "None: no checks, the model after all `updates` is kept.")
    check_from: int = Field(500, ge=1, description="First update with a check (with band).")
    check_every: int = Field(100, ge=1, description="Updates between checks (with band).")
    check_tasks: int = Field(256, ge=1, description="Validation tasks per check (with band): drawn with the "
                                                    "training tasks, never trained on.")
    check_samples: int = Field(
        0, ge=0, le=16, description="Sampled episodes (temperature 1) per validation task at each check, beside the "
                                    "greedy one (0: greedy only); the check records their solve rate.")
    band_on: BandOn = Field(
        "greedy", description="The check's rate the band applies to: greedy, or sampled (needs check_samples).")
    stop_above_band: bool = Field(
        False, description="With band: end the SFT at the first check whose rate lies above the band (the kept "
                           "checkpoint is chosen among the checks so far) instead of running all `updates`.")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in RENAMED.items():
                if old in data:
                    raise ValueError(f"{old} is now {new} (docs/configuration.md)")
        return data

    @model_validator(mode="after")
    def _checks(self) -> SftConfig:
        if self.band is not None:
            low, high = self.band
            if not 0.0 <= low <= high <= 1.0:
                raise ValueError(f"band must be [low, high] with 0 <= low <= high <= 1, got {list(self.band)}")
            if not self.is_check(self.updates):
                raise ValueError(f"band needs a check after the last update: {self.updates} is not check_from "
                                 f"{self.check_from} plus a multiple of check_every {self.check_every}")
        if self.stop_above_band and self.band is None:
            raise ValueError("stop_above_band needs a band (the checks it stops on)")
        if self.band_on == "sampled" and self.check_samples == 0:
            raise ValueError("band_on: sampled needs check_samples >= 1 (sampled episodes per validation task)")
        return self

    def is_check(self, update: int) -> bool:
        """Whether a check runs after `update` (only with band)."""
        return (self.band is not None and update >= self.check_from
                and (update - self.check_from) % self.check_every == 0)

    def stops_after(self, checks: list[dict[str, Any]]) -> bool:
        """Whether the SFT ends after the last of `checks` (`stop_above_band`)."""
        return (self.stop_above_band and self.band is not None and bool(checks)
                and checks[-1][CHECK_RATE[self.band_on]] > self.band[1])

    def num_drawn(self) -> int:
        """Tasks drawn from the env: the training tasks, then the validation tasks of the checks."""
        return self.num_tasks + (self.check_tasks if self.band is not None else 0)

    def fingerprint(self) -> str:
        """Identifies the checkpoint this config produces (used to reuse a cached SFT)."""
        # Checks that only measure (sampled rates the band does not read) leave the kept model as it is.
        measured_only = {"check_samples", "band_on"} if self.band_on == "greedy" else set()
        fields = self.model_dump_json(exclude={"out", "save_at"} | measured_only)
        return hashlib.sha256(f"{SFT_DATA_VERSION}:{fields}".encode()).hexdigest()[:16]


CHECK_RATE: dict[BandOn, str] = {"greedy": "validation_solve_rate", "sampled": "validation_sampled_rate"}


def kept_update(band: tuple[float, float] | None, checks: list[dict[str, Any]], ran: int,
                band_on: BandOn = "greedy") -> int:
    """The update whose model the SFT keeps after `ran` updates: the last one without checks, else the
    last check whose `band_on` rate lies inside `band`, else the check nearest to it (the later one of
    equally near)."""
    if band is None or not checks:
        return ran
    low, high = band
    rates = [c[CHECK_RATE[band_on]] for c in checks]
    inside = [c["updates"] for c, rate in zip(checks, rates, strict=True) if low <= rate <= high]
    if inside:
        return int(inside[-1])
    distance = [max(low - rate, rate - high) for rate in rates]
    nearest = min(distance)
    return int([c["updates"] for c, d in zip(checks, distance, strict=True) if d == nearest][-1])
