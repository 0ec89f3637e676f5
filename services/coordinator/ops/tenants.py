"""Tenants: who an API token speaks for, what it may see, and how much each tenant may queue and run.

`MMRL_API_TOKENS_FILE` names a YAML (or TOML) file, e.g. mounted from a Kubernetes Secret:

    tokens:
      - {token: <secret>, tenant: vision, role: member}
      - {token: <secret>, tenant: platform, role: admin}
    tenants:
      vision: {max_queued: 4, max_running: 1}

A member sees and controls only its tenant's runs (another tenant's run answers 404, as an unknown
one does, so run ids do not leak); an admin sees and controls every run. A run belongs to the tenant
of the token that created it, or of the trigger rule whose event did. `MMRL_API_TOKEN` is one more
admin token, of the tenant `default`; with no token at all the API is open and every caller is an
admin of `default`. Limits: `max_queued` runs of a tenant waiting in the queue (a run beyond it is
refused, HTTP 429 naming the limit), `max_running` runs of a tenant holding learner pools at once
(the others wait in the queue); 0 or a tenant not listed: no limit.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.common.config_files import read_config_file
from services.coordinator.ops.store import DEFAULT_TENANT

TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
Role = Literal["admin", "member"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenEntry(_Strict):
    token: str = Field(..., min_length=1, description="The bearer token (e.g. `openssl rand -hex 32`).")
    tenant: str = Field(..., pattern=TENANT_PATTERN, description="The tenant it speaks for.")
    role: Role = Field("member", description="admin: every run; member: its tenant's runs only.")


class TenantLimits(_Strict):
    max_queued: int = Field(0, ge=0, description="Runs of the tenant that may wait in the queue (0 = no limit).")
    max_running: int = Field(0, ge=0, description="Runs of the tenant that may hold learner pools at once "
                                                  "(0 = no limit); the others wait in the queue.")


class TokensFile(_Strict):
    """The file MMRL_API_TOKENS_FILE names."""

    tokens: list[TokenEntry] = Field(default_factory=list, description="Each token and whom it speaks for.")
    tenants: dict[str, TenantLimits] = Field(default_factory=dict, description="Limits per tenant.")

    @model_validator(mode="after")
    def _distinct(self) -> TokensFile:
        if len({t.token for t in self.tokens}) != len(self.tokens):
            raise ValueError("a token is listed twice")
        bad = sorted(name for name in self.tenants if not re.fullmatch(TENANT_PATTERN, name))
        if bad:
            raise ValueError(f"tenants: {bad} are not tenant names (lower-case letters, digits, '-', '_')")
        return self


@dataclass(frozen=True)
class Caller:
    """Whom a request speaks for."""

    tenant: str
    role: Role

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def sees(self, run: dict[str, Any]) -> bool:
        """Whether this caller may see and control `run`."""
        return self.admin or run["tenant"] == self.tenant


OPEN = Caller(DEFAULT_TENANT, "admin")  # every caller of an API without tokens


class Tenants:
    def __init__(self, entries: list[TokenEntry], limits: dict[str, TenantLimits] | None = None) -> None:
        self.entries = entries
        self.limits_by_tenant = limits or {}

    @classmethod
    def load(cls, api_token: str = "", tokens_file: Path | None = None) -> Tenants:
        """The tokens of the file (ValueError or OSError when it cannot be read or is invalid) and
        `api_token` as an admin of `default`."""
        data = TokensFile.model_validate(read_config_file(tokens_file)) if tokens_file else TokensFile()
        entries = list(data.tokens)
        if api_token:
            entries.append(TokenEntry(token=api_token, tenant=DEFAULT_TENANT, role="admin"))
        if len({entry.token for entry in entries}) != len(entries):
            raise ValueError("MMRL_API_TOKEN is also listed in MMRL_API_TOKENS_FILE: list each token once")
        return cls(entries, data.tenants)

    @property
    def open(self) -> bool:
        """No token is configured: every caller is an admin of `default`."""
        return not self.entries

    def tokens(self) -> list[str]:
        return [entry.token for entry in self.entries]

    def caller(self, token: str) -> Caller | None:
        """Whom `token` speaks for (OPEN without tokens); None for a token not listed. Every entry is
        compared, in constant time, so the time taken does not tell which one matched."""
        if self.open:
            return OPEN
        found = None
        for entry in self.entries:
            if hmac.compare_digest(token.encode(), entry.token.encode()):
                found = Caller(entry.tenant, entry.role)
        return found

    def limits(self, tenant: str) -> TenantLimits:
        return self.limits_by_tenant.get(tenant) or TenantLimits()

    def max_running(self) -> dict[str, int]:
        """Each limited tenant's `max_running`, for the scheduler."""
        return {name: limits.max_running for name, limits in self.limits_by_tenant.items() if limits.max_running}
