"""Trigger settings (MMRL_TRIGGER_* environment variables) and the rules file that maps an S3
object's key to what it starts."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.config_files import read_config_file
from services.coordinator.ops.store import DEFAULT_TENANT
from services.coordinator.ops.tenants import TENANT_PATTERN


class TriggerRule(BaseModel):
    """What an S3 object whose key matches `pattern` starts."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=100, description="Shown in the trigger events and on the run.")
    bucket: str = Field("", description="Bucket the object must be in ('' = any bucket).")
    pattern: str = Field(
        ..., min_length=1,
        description="Glob over the whole (decoded) key, as Python's fnmatch reads it: '*' also matches '/' "
                    "(e.g. 'mmrl/configs/*.yaml').",
    )
    action: Literal["config", "dataset"] = Field(
        ..., description="'config': the object is a run config (YAML, JSON or TOML by its suffix); 'dataset': "
                         "start the run config `config` with the object as its dataset.",
    )
    config: Path | None = Field(
        None, description="dataset: path, on the coordinator, of the run config file to start.")
    option: str = Field(
        "dataset", min_length=1,
        description="dataset: the env option (env.options.<option>) that receives the object's s3:// URI.",
    )
    tenant: str = Field(DEFAULT_TENANT, pattern=TENANT_PATTERN,
                        description="The tenant its runs belong to (and whose member tokens may post its events).")

    @model_validator(mode="after")
    def _dataset_names_a_config(self) -> TriggerRule:
        if self.action == "dataset" and self.config is None:
            raise ValueError(f"rule {self.name!r}: a dataset rule names the run config it starts (config: PATH)")
        if self.action == "config" and self.config is not None:
            raise ValueError(f"rule {self.name!r}: a config rule starts the object itself; drop config")
        return self

    def matches(self, bucket: str, key: str) -> bool:
        return (not self.bucket or self.bucket == bucket) and fnmatchcase(key, self.pattern)


class TriggerRules(BaseModel):
    """The rules file: the first rule that matches an object decides."""

    model_config = ConfigDict(extra="forbid")

    rules: list[TriggerRule] = Field(default_factory=list, description="Tried in order; the first match wins.")

    def match(self, bucket: str, key: str, tenant: str | None = None) -> TriggerRule | None:
        """The first rule that matches the object (among `tenant`'s rules when one is given)."""
        return next((rule for rule in self.rules
                     if rule.matches(bucket, key) and tenant in (None, rule.tenant)), None)


class TriggerSettings(BaseSettings):
    """Deployment settings of the triggers, from MMRL_TRIGGER_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="MMRL_TRIGGER_", extra="ignore")

    rules_file: Path | None = Field(
        None, description="YAML rules file (docs/triggers.md); without one every S3 event is rejected as unmatched.")
    hmac_secret: str = Field(
        "", description="Shared secret of the X-MMRL-Signature header ('' = signatures are not accepted).")
    signature_tolerance_s: float = Field(
        300.0, gt=0, description="How far a signature's timestamp may be from the coordinator's clock.")
    inbox_poll_s: float = Field(
        1.0, ge=0, description="Seconds between scans of <shared_root>/inbox (0 = no inbox).")
    object_source: Literal["filesystem", "s3"] = Field(
        "filesystem", description="Where config objects are read: the mounted bucket directory, or S3 (boto3).")
    buckets_dir: Path | None = Field(
        None, description="filesystem: an object is read at <buckets_dir>/<bucket>/<key> "
                          "(None = <shared_root>/buckets).")
    s3_endpoint_url: str = Field("", description="s3: endpoint URL ('' = AWS's for the configured region).")
    max_object_bytes: int = Field(1 << 20, ge=1, description="Largest config object read.")

    def load_rules(self) -> TriggerRules:
        if self.rules_file is None:
            return TriggerRules()
        return TriggerRules.model_validate(read_config_file(self.rules_file))
