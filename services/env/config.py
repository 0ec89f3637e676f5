"""The env service's typed configuration.

`EnvConfig` holds the environment's limits and defaults (a YAML or TOML file, see `load_config`);
`ServerSettings` the deployment settings, from environment variables prefixed `MMRL_ENV_`
(e.g. MMRL_ENV_PORT=50051, MMRL_ENV_CONFIG_FILE=/etc/mmrl/env.yaml).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Self

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.config_files import read_config_file
from services.common.tracing import TracingMode
from services.env.maze.maze import MIN_SIZE
from services.env.maze.render import frame_side


class EnvConfig(BaseModel):
    """Limits of the env service, and the maze's defaults (its options a spec leaves out)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_live_episodes: int = Field(default=16384, ge=1)
    """Most episodes alive at once; CreateEpisodes beyond it fails with RESOURCE_EXHAUSTED."""
    idle_ttl_s: float = Field(default=900.0, gt=0)
    """An episode neither created nor stepped for this long is forgotten (then NOT_FOUND)."""
    max_batch: int = Field(default=4096, ge=1)
    """Most specs, actions or episode ids in one request (INVALID_ARGUMENT beyond)."""
    max_action_chars: int = Field(default=8192, ge=1)
    """Longest accepted action text in characters (INVALID_ARGUMENT beyond)."""
    default_max_moves: int | None = Field(default=None, ge=1)
    """Move budget when a spec says 0; None: ceil(1.25 * cells), i.e. 20 for the 9x9 grid (4x4 cells)."""
    max_max_moves: int = Field(default=10_000, ge=1)
    """Largest move budget a spec may ask for."""
    default_size: int = Field(default=9, ge=MIN_SIZE)
    """Grid side (odd, outer wall included) when a spec has no "size" option."""
    min_size: int = Field(default=MIN_SIZE, ge=MIN_SIZE)
    """Smallest grid side accepted."""
    max_size: int = Field(default=51, ge=MIN_SIZE, le=201)
    """Largest grid side accepted."""
    default_unit_px: int = Field(default=8, ge=1)
    """Pixels per grid unit when a spec has no "unit_px" option (8: the 9x9 grid makes 80x80 px)."""
    max_unit_px: int = Field(default=32, ge=1, le=64)
    """Largest "unit_px" accepted."""
    max_frame_px: int = Field(default=1024, ge=1)
    """Largest frame side in pixels, (size + 1) * unit_px (e.g. size 51 needs unit_px <= 19). Bounds memory:
    each maze in use keeps its frame without the agent, side**2 bytes (1 MiB at 1024 px)."""
    maze_cache_size: int = Field(default=1024, ge=0)
    """Mazes (layout, solver distances, renderer) kept for reuse, least recently used out; the
    episodes of a GRPO group play the same maze and share one."""
    frame_cache: bool = True
    """Cache each maze's PNG per agent cell (frames are deterministic; at most one per cell)."""
    frame_cache_bytes: int = Field(default=1 << 20, ge=0)
    """PNG bytes cached per maze; frames past it are encoded on each use (all 16 frames of a 9x9
    maze take 5 KB, all 625 of a 988 px 51-grid maze 17 MB)."""

    @model_validator(mode="after")
    def _check_sizes(self) -> Self:
        if not self.min_size <= self.default_size <= self.max_size:
            raise ValueError(f"default_size {self.default_size} outside [{self.min_size}, {self.max_size}]")
        if self.default_size % 2 == 0:
            raise ValueError(f"default_size must be odd, got {self.default_size}")
        if not 1 <= self.default_unit_px <= self.max_unit_px:
            raise ValueError(f"default_unit_px {self.default_unit_px} outside [1, {self.max_unit_px}]")
        if frame_side(self.default_size, self.default_unit_px) > self.max_frame_px:
            raise ValueError(f"default_size {self.default_size} at default_unit_px {self.default_unit_px} makes "
                             f"frames larger than max_frame_px={self.max_frame_px}")
        return self

    def max_moves_for(self, size: int) -> int:
        """The default move budget for a grid of side `size`."""
        if self.default_max_moves is not None:
            return self.default_max_moves
        num_cells = ((size - 1) // 2) ** 2
        return math.ceil(1.25 * num_cells)


class ServerSettings(BaseSettings):
    """Deployment settings of `mmrl serve env`, from MMRL_ENV_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="MMRL_ENV_", extra="forbid", use_attribute_docstrings=True)

    env: str = Field(default="maze", min_length=1, max_length=100)
    """The environment served, by its name in services/env/registry.py: "maze" (docs/env.md),
    "sokoban" (docs/sokoban.md) (MMRL_ENV_ENV)."""
    gymnasium: str = Field(default="", max_length=200)
    """A Gymnasium environment served instead of `env`: a preset ("minigrid-empty-6x6", "frozenlake-4x4")
    or any Gymnasium id that renders rgb_array frames (docs/environments.md; MMRL_ENV_GYMNASIUM)."""
    gymnasium_kwargs: dict[str, Any] = Field(default_factory=dict)
    """With `gymnasium`: gymnasium.make() keyword arguments, as JSON (MMRL_ENV_GYMNASIUM_KWARGS)."""
    action_words: str = ""
    """With `gymnasium`: comma-separated words for actions 0, 1, ... (default: the env's own names); with
    `openenv`: the words of its text actions (MMRL_ENV_ACTION_WORDS)."""
    openenv: str = Field(default="", max_length=500)
    """An OpenEnv server played instead of `env`: its URL, e.g. http://127.0.0.1:8010, one session per
    episode (docs/environments.md; MMRL_ENV_OPENENV)."""
    openenv_action_field: str = Field(default="message", min_length=1, max_length=100)
    """With `openenv`: the action's field that carries the text (MMRL_ENV_OPENENV_ACTION_FIELD)."""
    host: str = "0.0.0.0"
    """Address to listen on (MMRL_ENV_HOST)."""
    port: int = Field(default=50051, ge=0, le=65535)
    """Port to listen on; 0 picks a free one (MMRL_ENV_PORT)."""
    log_level: str = Field(
        default="INFO", validation_alias=AliasChoices("MMRL_ENV_LOG_LEVEL", "MMRL_LOG_LEVEL", "log_level")
    )
    """Logging level (MMRL_ENV_LOG_LEVEL, else MMRL_LOG_LEVEL, which every service reads)."""
    config_file: Path | None = None
    """YAML or TOML file with EnvConfig fields (MMRL_ENV_CONFIG_FILE); unset: defaults."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the Prometheus /metrics HTTP endpoint (MMRL_ENV_METRICS_PORT); 0: not served."""
    tracing: TracingMode = Field(
        default="off", validation_alias=AliasChoices("MMRL_ENV_TRACING", "MMRL_TRACING", "tracing"))
    """OpenTelemetry tracing: off, otlp (OTEL_EXPORTER_OTLP_* variables) or console (MMRL_ENV_TRACING,
    else MMRL_TRACING)."""


def load_config(path: Path | None) -> EnvConfig:
    """EnvConfig from a YAML (.yaml/.yml) or TOML (.toml) file; defaults when `path` is None."""
    if path is None:
        return EnvConfig()
    return EnvConfig.model_validate(read_config_file(path))
