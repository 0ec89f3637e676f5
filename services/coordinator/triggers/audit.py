"""The trigger audit trail: every event the coordinator was given, accepted or not, in a Redis
stream (`mmrl:trigger:events`, newest 10,000 kept), served by GET /v1/triggers/events."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.coordinator.ops.store import PREFIX

KEY = f"{PREFIX}trigger:events"
MAXLEN = 10_000
Outcome = Literal["started", "duplicate", "rejected", "ignored"]


class TriggerOutcome(BaseModel):
    """What one event did."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field("", description="Stream id of the audit record ('' until recorded).")
    received_at: float = Field(default_factory=time.time, description="Unix time the coordinator got it.")
    outcome: Outcome = Field(..., description="started, duplicate (an earlier delivery started its run), "
                                              "rejected (nothing started; see reason) or ignored.")
    status_code: int = Field(..., description="The HTTP status this outcome answers with.")
    reason: str = Field("", description="Why it was rejected or ignored.")
    run_id: str = Field("", description="The run it started, or the run an earlier delivery started.")
    rule: str = Field("", description="The trigger rule that matched ('inbox' for inbox files).")
    tenant: str = Field("", description="The tenant of that rule ('' when no rule matched).")
    event: dict[str, Any] = Field(default_factory=dict, description="source, bucket, key, etag, "
                                  "version_id, sequencer, version, size, time, event_id as the event gave them.")


class TriggerLog:
    def __init__(self, client: Any) -> None:
        self.r = client

    async def add(self, outcome: TriggerOutcome) -> TriggerOutcome:
        data = outcome.model_dump(exclude={"id"})
        entry_id = await self.r.xadd(KEY, {"data": json.dumps(data)}, maxlen=MAXLEN, approximate=True)
        return outcome.model_copy(update={"id": str(entry_id)})

    async def newest(self, limit: int, outcome: str | None = None, source: str | None = None,
                     key: str | None = None, tenant: str | None = None) -> list[TriggerOutcome]:
        """Up to `limit` records, newest first, of the given outcome, event source, object key and
        tenant."""
        found: list[TriggerOutcome] = []
        before = "+"
        while len(found) < limit:
            page = await self.r.xrevrange(KEY, max=before, min="-", count=500)
            for entry_id, fields in page:
                record = TriggerOutcome(id=entry_id, **json.loads(fields["data"]))
                if ((outcome is None or record.outcome == outcome)
                        and (source is None or record.event.get("source") == source)
                        and (key is None or record.event.get("key") == key)
                        and (tenant is None or record.tenant == tenant)):
                    found.append(record)
            if len(page) < 500:
                break
            before = f"({page[-1][0]}"
        return found[:limit]
