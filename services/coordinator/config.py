"""Run configuration (one YAML file per run) and the coordinator's deployment settings.

A run config is validated with `extra="forbid"`: a misspelt key is an error, not a silent default.
The resolved config is stored with the run (Redis; `GET /v1/runs/{id}` returns it); the learner
writes its part to `runs/<run_id>/learner_config.json` on shared storage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.config_files import apply_overrides, read_config_file
from services.common.conversation import DEFAULT_SYSTEM_PROMPT
from services.common.storage import DEFAULT_SHARED_ROOT
from services.common.tracing import TracingMode
from services.common.training import LoraSettings, LossSettings, OptimSettings, TrainSettings
from services.coordinator.grpo.advantages import Normalize
from services.coordinator.grpo.credit import VARIANTS
from services.coordinator.grpo.sampling import STRATEGIES

PRIORITY_BOUND = 1000  # a run's priority lies in [-1000, 1000] (the queue's score packs it with the queue order)

# Settings renamed since: a config that still says the old name is refused with the new one.
RENAMED_GRPO = {"mazes_per_step": "tasks_per_step", "extra_mazes": "extra_tasks",
                "dynamic_sampling": "group_sampling ('dynamic' or 'plain')"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN/Infinity: a 422 naming the field


class EnvSettings(_Strict):
    """The environment every episode of the run plays (whatever server answers at the env address)."""

    name: str = Field("", max_length=100, description="The environment the run expects (its GetEnvInfo name, "
                                                      "e.g. 'maze'); a run on another is refused ('' = any).")
    max_moves: int = Field(20, ge=1, le=1000, description="Move budget per training episode.")
    options: dict[str, str] = Field(
        default_factory=dict, description="Environment settings of every training task, passed through "
                                          "unchanged (the maze: size, unit_px, require_stop, start, goal).",
    )


class SamplingSettings(_Strict):
    """How actions are sampled during training."""

    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature (0 = greedy; at most 2, vLLM's bound).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int = Field(8, ge=1, le=4096, description="Token budget of one action.")
    actions: Literal["free", "constrained"] = Field(
        "free", description="'free': any text; 'constrained': the rollout generates only the env's action words "
                            "(then <|im_end|>), and every log-prob, the learner's too, is renormalised over the "
                            "tokens allowed where it stands (services/common/constrained.py); evals too.")


class GrpoSettings(_Strict):
    """Group sampling, advantages and the clipped surrogate loss."""

    group_size: int = Field(8, ge=2, le=256, description="G: episodes per task, all on the same task.")
    tasks_per_step: int = Field(8, ge=1, le=1024, description="B: tasks (groups) per training step.")
    greedy_per_group: int = Field(
        0, ge=0, le=255,
        description="Episodes of each group played greedily (temperature 0), the rest sampled: the mode's own "
                    "way through the maze, which the greedy eval measures, gets an advantage in its group "
                    "(0 = all sampled).",
    )
    advantage_norm: Normalize = Field(
        "std", description="'std': GRPO (r - mean)/std; 'none': Dr. GRPO (r - mean)."
    )
    discount: float = Field(
        1.0, gt=0.0, le=1.0,
        description="gamma: an episode's return is the sum of gamma**t times turn t's reward (1 = the plain "
                    "sum of rewards).",
    )
    credit: str = Field(
        "grpo", description="Credit assignment variant (services/coordinator/grpo/credit.py): 'grpo' (the episode's "
                            "group-relative advantage on every turn) or 'gigpo' (needs the env's state keys).",
    )
    step_advantage_weight: float = Field(
        1.0, ge=0.0, le=10.0,
        description="With credit 'gigpo': weight of the step-level advantage among a group's turns taken from "
                    "the same environment state, on returns-to-go discounted by `discount`.",
    )
    invalid_penalty: float = Field(
        0.0, ge=0.0, le=10.0,
        description="Subtracted from the advantage of every turn whose action the env could not read (its "
                    "info.invalid: e.g. two moves run together, 'downright'), whatever the episode's reward "
                    "(0 = off).",
    )
    revisit_penalty: float = Field(
        0.0, ge=0.0, le=10.0,
        description="Subtracted from the advantage of every turn after which the episode was back at an "
                    "observation it had already seen (a no-op such as a wall bump, or the move that closes a "
                    "loop), whatever the episode's reward: a policy that sees the current frame alone "
                    "(history_window 0) plays greedily the same way round again (0 = off).",
    )
    group_sampling: str = Field(
        "plain", description="Which played groups a step trains on (services/coordinator/grpo/sampling.py): "
                             "'plain' (one round, all of them) or 'dynamic' (DAPO: groups whose returns are all "
                             "equal are replaced by fresh tasks).")
    max_sampling_rounds: int = Field(
        3, ge=1, le=32, description="With group_sampling 'dynamic': at most this many rounds of play per step."
    )
    extra_tasks: int = Field(
        0, ge=0, le=1024,
        description="With group_sampling 'dynamic': tasks played per round beyond those still needed, so that "
                    "dropped groups are replaced in the same round instead of a later one.",
    )
    async_rollout: bool = Field(
        False,
        description="Sample step s+1 while the learner trains on step s: episodes come from the policy "
                    "one version behind the learner's (set tis_cap to correct for it). Not with colocated.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in RENAMED_GRPO.items():
                if old in data:
                    raise ValueError(f"grpo.{old} is now {new} (docs/configuration.md)")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GrpoSettings:
        if self.credit not in VARIANTS:
            raise ValueError(f"grpo.credit {self.credit!r} is not a registered variant "
                             f"(known: {', '.join(sorted(VARIANTS))})")
        if self.group_sampling not in STRATEGIES:
            raise ValueError(f"grpo.group_sampling {self.group_sampling!r} is not a registered strategy "
                             f"(known: {', '.join(sorted(STRATEGIES))})")
        if self.greedy_per_group >= self.group_size:
            raise ValueError(f"grpo.greedy_per_group ({self.greedy_per_group}) must leave sampled episodes in a "
                             f"group of grpo.group_size {self.group_size}: greedy episodes of one task are all alike")
        for kind, chosen, registry in (("credit", self.credit, VARIANTS), ("group_sampling", self.group_sampling,
                                                                          STRATEGIES)):
            changed = {f for f, info in type(self).model_fields.items() if getattr(self, f) != info.default}
            for name, variant in registry.items():
                idle = sorted((set(variant.uses) - set(registry[chosen].uses)) & changed)
                if name != chosen and idle:
                    raise ValueError(f"grpo.{idle[0]} does nothing with grpo.{kind} {chosen!r} (it is read by "
                                     f"{kind} {name!r}): remove it or choose that {kind}")
        return self


class EvalSettings(_Strict):
    """Evaluation on the fixed eval set (step 0, every `interval` steps and the last step)."""

    interval: int = Field(10, ge=1, description="Steps between evaluations.")
    eval_set: str = Field("", description="Eval set name ('' = the environment's default set).")
    max_tasks: int = Field(0, ge=0, description="Evaluate only the first N tasks of the set (0 = all).")
    sampled_samples: int = Field(4, ge=0, le=64, description="Sampled episodes per task (0 = skip).")
    sampled_temperature: float = Field(1.0, gt=0.0, le=2.0, description="Temperature of sampled eval.")
    save_frames: bool = Field(True, description="Write greedy eval episodes' frames to shared storage.")
    held_out_set: str = Field(
        "", description="An eval set of the environment played greedily by the start (with the step-0 eval) and "
                        "by the final policy (after the last step), e.g. tasks no training plays outside the fixed "
                        "set (maze-held-out-256); the rate is those evals' held_out_solve_rate, how its failures "
                        "failed their held_out_failed_stuck, _cycling and _other (as greedy_failed_*), its time "
                        "their held_out_eval_s, apart from eval_s ('' = none).")


class FrameSettings(_Strict):
    """Which training episodes keep their frames on shared storage
    (`runs/<id>/episodes/train_step_<N>/`), for the console's episode pages. Greedy eval episodes
    keep theirs by `eval.save_frames`."""

    train: Literal["off", "groups", "all"] = Field(
        "groups", description="off: none; groups: the first `train_groups` groups of every step; all: every episode.")
    train_groups: int = Field(2, ge=1, description="Groups of every step whose frames are kept (train: groups).")


class Endpoints(_Strict):
    """Service addresses; empty values fall back to the coordinator's settings (MMRL_*_ADDR)."""

    env: list[str] = Field(default_factory=list, description="host:port of every env replica.")
    rollout: list[str] = Field(default_factory=list, description="host:port of every rollout replica.")
    learner: str = Field("", description="host:port of the learner (rank 0) the run must run on ('' = whichever "
                                         "learner pool is free first).")


class RunConfig(_Strict):
    """Everything one GRPO run needs. See configs/*.yaml for complete examples."""

    name: str = Field("run", min_length=1, max_length=100, description="Human-readable run name.")
    seed: int = Field(0, ge=0, le=2**31 - 1,
                      description="Run seed; the tasks of step s are a function of (seed, s).")
    model: str = Field(..., min_length=1, description="Model directory or hub id (tokenizer source).")
    env: EnvSettings = Field(default_factory=EnvSettings)  # type: ignore[arg-type]
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)  # type: ignore[arg-type]
    grpo: GrpoSettings = Field(default_factory=GrpoSettings)  # type: ignore[arg-type]
    lora: LoraSettings = Field(default_factory=LoraSettings)  # type: ignore[arg-type]
    optim: OptimSettings = Field(default_factory=OptimSettings)  # type: ignore[arg-type]
    loss: LossSettings = Field(default_factory=LossSettings)  # type: ignore[arg-type]
    eval: EvalSettings = Field(default_factory=EvalSettings)  # type: ignore[arg-type]
    frames: FrameSettings = Field(default_factory=FrameSettings)  # type: ignore[arg-type]
    endpoints: Endpoints = Field(default_factory=Endpoints)  # type: ignore[arg-type]
    steps: int = Field(10, ge=1, le=1_000_000, description="GRPO steps to run.")
    priority: int = Field(
        0, ge=-PRIORITY_BOUND, le=PRIORITY_BOUND,
        description="Place in the run queue while every learner pool is busy: higher starts first, runs of one "
                    "priority in the order they were queued (a run request's `priority` overrides it).")
    checkpoint_interval: int = Field(5, ge=1, description="Steps between learner checkpoints.")
    max_turns: int = Field(0, ge=0, description="Turn cap per episode (0 = env.max_moves).")
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, description="System turn of every conversation.")
    history_window: int | None = Field(
        None, ge=0, le=1000,
        description="Answered turns each prompt keeps: None = the whole conversation; k = the system turn, "
                    "the last k turns and the current observation, each turn then a trajectory of its own "
                    "(services/common/conversation.py); 0 = the current observation alone. Must match the "
                    "SFT start's `history_window`.")
    colocated: bool = Field(
        False, description="Sleep the rollout engine during training (vLLM sleep mode; GPU only)."
    )
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default=["tensorboard"],
        description="Experiment trackers fed every step and eval (services/coordinator/ops/trackers.py); "
                    "tensorboard writes runs/<id>/tensorboard/ on shared storage.")

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.colocated and self.grpo.async_rollout:
            raise ValueError("grpo.async_rollout samples while the learner trains; "
                             "a colocated rollout engine sleeps then (set one of them false)")
        if self.optim.lr_schedule == "cosine" and self.optim.warmup_steps >= self.steps * self.optim.steps_per_train_step:
            raise ValueError("optim.warmup_steps must be shorter than the run (steps x num_minibatches x epochs "
                             "optimiser steps) to leave room for the cosine decay")
        if self.grpo.async_rollout and self.loss.old_logprobs == "rollout":
            raise ValueError("grpo.async_rollout samples with the version before the learner's, so the "
                             "rollout log-probs are not the old policy (set loss.old_logprobs: learner)")
        return self

    @property
    def turn_limit(self) -> int:
        return self.max_turns or self.env.max_moves

    def train_settings(self, action_sequences: tuple[tuple[int, ...], ...] = ()) -> TrainSettings:
        """What the learner trains this run with (sent with ConfigureRun); the cosine schedule spans
        the run's optimiser steps; `action_sequences`: the constrained actions' mask, if any."""
        total = self.steps * self.optim.steps_per_train_step if self.optim.lr_schedule == "cosine" else None
        return TrainSettings(lora=self.lora, optim=self.optim, loss=self.loss, seed=self.seed, total_steps=total,
                             action_sequences=action_sequences)


def load_run_config(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Reads a YAML run config; `overrides` maps dotted keys ("grpo.group_size") to values."""
    return RunConfig.model_validate(apply_overrides(read_config_file(Path(path)), overrides or {}))


class CoordinatorSettings(BaseSettings):
    """Deployment settings, from MMRL_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="MMRL_", extra="ignore")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding runs, metrics, events.")
    api_token: str = Field("", description="Bearer token for /v1 routes, an admin of the tenant 'default' ('' and no "
                                           "tokens file = no auth).")
    api_tokens_file: Path | None = Field(None, description=(
        "YAML file of API tokens, each with its tenant and role (admin or member), and per-tenant limits "
        "(docs/coordinator.md, \"Tenants\"); e.g. mounted from a Secret. A bad file stops the coordinator at start."))
    shared_root: Path = Field(
        DEFAULT_SHARED_ROOT, description="Shared storage root, the same directory every service uses (/shared in containers)."
    )
    env_addr: str = Field("127.0.0.1:50051", description="Comma-separated env replicas (host:port).")
    rollout_addrs: str = Field("127.0.0.1:50052", description="Comma-separated rollout replicas.")
    learner_addrs: str = Field("127.0.0.1:50053", description=(
        "Comma-separated learner pools, each the host:port of one learner service's rank 0; each pool holds "
        "one run at a time, and queued runs start on the first free one (docs/coordinator.md, \"The run queue and learner pools\")."))
    rpc_timeout_s: float = Field(600.0, gt=0, description="Deadline of one gRPC call.")
    rpc_retries: int = Field(3, ge=0, le=20, description="Retries of an UNAVAILABLE gRPC call.")
    resume_runs: bool = Field(True, description="Resume runs left running by a previous coordinator.")
    run_restarts: int = Field(3, ge=0, le=100, description=(
        "Times a run resumes from its newest checkpoint after losing a service (UNAVAILABLE after the "
        "retries, or a learner that no longer holds the run: it was restarted), each time the coordinator "
        "drives it (after a coordinator restart or a resume the count starts again)."))
    service_wait_s: float = Field(600.0, ge=0, description=(
        "Outage window: how long a run waits (polling with backoff) for a lost service or Redis to come back "
        "before it fails; the HyperPod overlay sets hours (node replacement plus model load)."))
    # Faults, leases and admission (docs/coordinator.md "Faults and recovery", "Limits").
    lease_ttl_s: float = Field(30.0, gt=0, description=(
        "A run's lease expires this long after its coordinator last renewed it (every third of it); then "
        "another coordinator on the same Redis adopts the run."))
    instance_id: str = Field("", description=(
        "This coordinator's lease owner id ('' = host name and API port: a coordinator restarted in place "
        "takes its runs back at once)."))
    max_request_bytes: int = Field(1_048_576, ge=1024, description=(
        "Largest request body the API reads (413 above it, checked before reading)."))
    allowed_models: str = Field("", description=(
        "Comma-separated model directories (a run's model must resolve under one) or exact hub ids a run "
        "may name, besides directories under shared_root; `mmrl up` adds its model directory."))
    keep_adapters: int = Field(0, ge=0, description=(
        "Adapter versions kept per run on shared storage, newest first, besides those a replica serves "
        "(0 = keep all)."))
    keep_checkpoints: int = Field(0, ge=0, description="Checkpoints kept per run, newest first (0 = keep all).")
    allowed_endpoints: str = Field("", description=(
        "Comma-separated host:port a run config's endpoints may name besides the configured env, rollout "
        "and learner addresses (anything else is refused with 422)."))
    host: str = Field("0.0.0.0", validation_alias=AliasChoices("MMRL_COORDINATOR_HOST", "host"),
                      description="Address the REST API listens on.")
    port: int = Field(8000, ge=0, le=65535, validation_alias=AliasChoices("MMRL_COORDINATOR_PORT", "port"),
                      description="Port of the REST API.")
    log_level: str = Field(
        "INFO", validation_alias=AliasChoices("MMRL_COORDINATOR_LOG_LEVEL", "MMRL_LOG_LEVEL", "log_level"),
        description="Logging level (MMRL_COORDINATOR_LOG_LEVEL, else MMRL_LOG_LEVEL, which every service reads).",
    )
    tracing: TracingMode = Field("off", description="OpenTelemetry tracing (MMRL_TRACING): off, otlp "
                                 "(OTEL_EXPORTER_OTLP_* variables) or console; one trace per GRPO step.")

    @model_validator(mode="after")
    def _names_a_pool(self) -> CoordinatorSettings:
        if not self.pools:
            raise ValueError("MMRL_LEARNER_ADDRS names no learner (host:port, comma-separated)")
        return self

    @property
    def pools(self) -> list[str]:
        """The learner pools, in the order the scheduler tries them."""
        return _addresses(self.learner_addrs)

    def endpoints_for(self, config: RunConfig, learner: str) -> Endpoints:
        """The services a run talks to: its config's endpoints, else the configured replicas, and the
        learner pool the scheduler gave it."""
        return Endpoints(
            env=config.endpoints.env or _addresses(self.env_addr),
            rollout=config.endpoints.rollout or _addresses(self.rollout_addrs),
            learner=learner,
        )


def _addresses(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]
