"""Request and response models of the REST API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.coordinator.config import PRIORITY_BOUND, RunConfig


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: RunConfig = Field(..., description="The run configuration (configs/*.yaml as JSON).")
    priority: int | None = Field(None, ge=-PRIORITY_BOUND, le=PRIORITY_BOUND,
                                 description="Place in the run queue (higher starts first); null: the config's.")


class RunUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: int = Field(..., ge=-PRIORITY_BOUND, le=PRIORITY_BOUND,
                          description="The run's new priority: a queued run moves to its place in the queue.")


class RunSummary(BaseModel):
    """A run as listed: its state and progress; the config and latest records are in GET /v1/runs/{id}."""

    id: str
    name: str
    state: str = Field(..., description="queued, pending, running, paused, succeeded, failed or stopped.")
    step: int = Field(..., description="Steps completed.")
    steps: int = Field(..., description="Steps the run will take.")
    created_at: float
    updated_at: float
    failure_reason: str = ""
    checkpoint_step: int
    adapter_version: int
    desired: str = Field("", description="A pause or stop requested but not yet applied.")
    tenant: str = Field(..., description="The tenant the run belongs to (docs/coordinator.md, \"Tenants\").")
    priority: int = Field(..., description="Its priority in the run queue (higher starts first).")
    queue_position: int | None = Field(
        None, description="Its place in the run queue while queued (1 = the next to start); null otherwise.")
    learner: str = Field("", description="The learner pool (rank 0's host:port) the run holds or last held; '' "
                                         "while queued.")
    trigger: dict[str, Any] | None = Field(
        None, description="The event that started the run (source, bucket, key, etag or version id, time, rule, "
                          "dataset); null for a run started by POST /v1/runs.")


class Run(RunSummary):
    """A run with its config and its latest step metrics and eval."""

    config: dict[str, Any]
    latest_metrics: dict[str, Any] | None = None
    latest_eval: dict[str, Any] | None = None


class RunList(BaseModel):
    runs: list[RunSummary] = Field(..., description="One page of runs, oldest first.")
    total: int = Field(..., description="Runs matching the query, over all pages.")
    offset: int = Field(..., description="Index of the first run of this page.")
    limit: int = Field(..., description="Page size asked for.")


class MetricsList(BaseModel):
    metrics: list[dict[str, Any]]


class EvalList(BaseModel):
    evals: list[dict[str, Any]]


class EpisodeList(BaseModel):
    episodes: list[dict[str, Any]]


class Health(BaseModel):
    status: str
    checks: dict[str, bool] = Field(default_factory=dict)
