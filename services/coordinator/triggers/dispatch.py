"""From an object event to a run: match a rule, skip what an earlier delivery started, build and
validate the run config, and queue it through the same RunManager.create as POST /v1/runs (it starts
when a learner pool is free), with the event's dedupe key claimed in the run's own Redis
transaction. Every outcome is audited."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from services.common.config_files import parse_config_text
from services.coordinator.config import RunConfig, load_run_config
from services.coordinator.ops.admission import NotAllowed
from services.coordinator.ops.manager import RunManager
from services.coordinator.ops.store import DEFAULT_TENANT, AlreadyClaimed, LimitReached, RunStore
from services.coordinator.triggers.audit import TriggerLog, TriggerOutcome
from services.coordinator.triggers.events import ObjectEvent
from services.coordinator.triggers.settings import TriggerRule, TriggerRules
from services.coordinator.triggers.sources import ObjectSource, SourceError

CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")


def invalid(exc: Exception) -> str:
    """A config error as one line naming each field."""
    if isinstance(exc, ValidationError):
        return "invalid run config: " + "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors())
    return str(exc)


def run_config_from(data: bytes, name: str) -> RunConfig:
    """A run config from a file's bytes (YAML, JSON or TOML by `name`'s suffix); ValueError saying
    what is wrong (a pydantic ValidationError names the fields)."""
    if not name.lower().endswith(CONFIG_SUFFIXES):
        raise ValueError(f"{name}: not a run config file (expected {', '.join(CONFIG_SUFFIXES)})")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{name}: not UTF-8 text") from None
    return RunConfig.model_validate(parse_config_text(text, name))


@dataclass(frozen=True)
class Where:
    """The rule an event matched and the tenant its run belongs to ('' and '': none matched)."""

    rule: str = ""
    tenant: str = ""


INBOX = Where("inbox", DEFAULT_TENANT)
NOWHERE = Where()


class Triggers:
    def __init__(self, manager: RunManager, store: RunStore, rules: TriggerRules, source: ObjectSource,
                 max_object_bytes: int = 1 << 20) -> None:
        self.manager, self.store, self.rules, self.source = manager, store, rules, source
        self.max_object_bytes = max_object_bytes
        self.log = TriggerLog(store.r)

    async def object_created(self, event: ObjectEvent, tenant: str | None = None) -> TriggerOutcome:
        """Starts what the first matching rule says, once per object version; with `tenant` (a member
        token posted the event), among that tenant's rules only."""
        rule = self.rules.match(event.bucket, event.key, tenant)
        if rule is None:
            return await self.reject(event, 422, f"no trigger rule matches {event.uri}")
        where = Where(rule.name, rule.tenant)
        earlier = await self.store.claimed_by(event.dedupe_key)
        if earlier:
            return await self._duplicate(event, earlier, where)
        try:
            config, extra = await self._config_for(rule, event)
        except SourceError as exc:
            return await self.reject(event, 502, str(exc), where)
        except (ValueError, OSError) as exc:
            return await self.reject(event, 422, invalid(exc), where)
        return await self.start(event, config, where, extra)

    async def config_file(self, event: ObjectEvent, data: bytes) -> TriggerOutcome:
        """Starts the run config in `data` (an inbox file, a run of the tenant 'default'), once per
        event version."""
        earlier = await self.store.claimed_by(event.dedupe_key)
        if earlier:
            return await self._duplicate(event, earlier, INBOX)
        try:
            config = run_config_from(data, event.key)
        except ValueError as exc:
            return await self.reject(event, 422, invalid(exc), INBOX)
        return await self.start(event, config, INBOX)

    async def _config_for(self, rule: TriggerRule, event: ObjectEvent) -> tuple[RunConfig, dict[str, Any]]:
        if rule.action == "dataset":
            assert rule.config is not None
            overrides = {f"env.options.{rule.option}": event.uri}
            return await asyncio.to_thread(load_run_config, rule.config, overrides), {"dataset": event.uri}
        data = await asyncio.to_thread(self.source.read, event.bucket, event.key, event.version_id,
                                       self.max_object_bytes)
        return run_config_from(data, event.key), {}

    async def start(self, event: ObjectEvent, config: RunConfig, where: Where,
                    extra: dict[str, Any] | None = None) -> TriggerOutcome:
        trigger = {**event.record(), "rule": where.rule, "received_at": time.time(), **(extra or {})}
        try:
            run = await self.manager.create(config, trigger=trigger, claim=event.dedupe_key, tenant=where.tenant)
        except AlreadyClaimed as exc:
            return await self._duplicate(event, exc.run_id, where)
        except NotAllowed as exc:
            return await self.reject(event, 422, str(exc), where)
        except LimitReached as exc:
            return await self.reject(event, 429, str(exc), where)
        return await self.log.add(TriggerOutcome(outcome="started", status_code=201, run_id=run["id"], rule=where.rule,
                                                 tenant=where.tenant, event=event.record()))

    async def _duplicate(self, event: ObjectEvent, run_id: str, where: Where) -> TriggerOutcome:
        return await self.log.add(TriggerOutcome(
            outcome="duplicate", status_code=200, run_id=run_id, rule=where.rule, tenant=where.tenant,
            event=event.record(), reason=f"this object version already started run {run_id!r}"))

    async def reject(self, event: ObjectEvent | None, status_code: int, reason: str, where: Where = NOWHERE,
                     body: Any = None) -> TriggerOutcome:
        """Records an event that starts nothing; `body` stands in for an event that could not be read."""
        record = event.record() if event is not None else {"body": body}
        return await self.log.add(TriggerOutcome(outcome="rejected", status_code=status_code, reason=reason,
                                                 rule=where.rule, tenant=where.tenant, event=record))
