"""The triggers of one coordinator: the rules, the object source and the inbox watcher, started and
stopped with the app."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.coordinator.config import CoordinatorSettings
from services.coordinator.ops.manager import RunManager
from services.coordinator.ops.store import RunStore
from services.coordinator.triggers.dispatch import Triggers
from services.coordinator.triggers.inbox import Inbox
from services.coordinator.triggers.settings import TriggerRules, TriggerSettings
from services.coordinator.triggers.sources import FilesystemSource, ObjectSource, S3Source


def object_source(settings: TriggerSettings, shared_root: str) -> ObjectSource:
    if settings.object_source == "s3":
        return S3Source(settings.s3_endpoint_url)
    from pathlib import Path

    return FilesystemSource(settings.buckets_dir or Path(shared_root) / "buckets")


@dataclass
class TriggerRuntime:
    triggers: Triggers
    inbox: Inbox
    watching: asyncio.Task[None] | None

    @classmethod
    def start(cls, manager: RunManager, store: RunStore, settings: CoordinatorSettings,
              trigger_settings: TriggerSettings, rules: TriggerRules) -> TriggerRuntime:
        triggers = Triggers(manager, store, rules, object_source(trigger_settings, str(settings.shared_root)),
                            trigger_settings.max_object_bytes)
        poll_s = trigger_settings.inbox_poll_s
        inbox = Inbox(settings.shared_root / "inbox", triggers, settle_s=poll_s)
        watching = asyncio.create_task(inbox.watch(poll_s), name="inbox") if poll_s > 0 else None
        return cls(triggers, inbox, watching)

    async def stop(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
            await asyncio.gather(self.watching, return_exceptions=True)
