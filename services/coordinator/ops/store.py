"""Run state in Redis: runs, configs, states, per-step metrics, eval history, episode records and
an event stream per run.

Keys (prefix `mmrl:`):
    runs                      sorted set of run ids by creation time
    run:<id>                  hash: id, name, state, config (JSON), step, steps, created_at,
                              updated_at, failure_reason, checkpoint_step, adapter_version, desired,
                              tenant, priority, learner (the pool it holds or held; "" while queued), queued_seq,
                              trigger (JSON, only on runs an event started)
    queue                     sorted set of the queued runs' ids, by -priority, then queue order
                              (queue_score); written in the same transaction as each run's state
    queue:seq                 counter: the order in which runs joined the queue
    learner:<host:port>       the run holding that learner pool, while it is pending or running there
    learners                  set of the learner addresses runs have held (queue.py)
    run:<id>:metrics          hash step -> JSON metrics of that step (one entry per step)
    run:<id>:evals            hash step -> JSON eval summary
    run:<id>:episodes         hash episode_id -> JSON record (frames stay on shared storage)
    run:<id>:events           stream of events (served as SSE)
    run:<id>:announced        hash metrics|evals -> highest step whose event is in the stream: a step
                              replayed after a restart is recorded again but announced once
    run:<id>:lease            id of the coordinator driving the run; expires unless renewed (lease.py)
    trigger:claim:<sha256>    run id an event (object + version) started; written with the run

The client reconnects and retries a command on a dropped connection (a Redis restart, stale pooled
connections) with exponential backoff for about REDIS_RETRY_S seconds before raising.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

PREFIX = "mmrl:"
EVENTS_MAXLEN = 10_000
REDIS_RETRIES = 8  # 0.1 + 0.2 + ... capped at 2 s: about 10 s of reconnecting before a command fails


class RunState(StrEnum):
    QUEUED = "queued"
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


TERMINAL = {RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED}
HOLDING = (RunState.PENDING, RunState.RUNNING)  # a run in these states holds its learner pool
DEFAULT_TENANT = "default"
QUEUE = f"{PREFIX}queue"
QUEUE_SEQ = f"{PREFIX}queue:seq"
_ORDER_BITS = 40  # queue_score: the queue order in the low 40 bits, the priority above (exact in a double)


def queue_score(priority: int, seq: int) -> float:
    """A queued run's score: lower starts first, so higher priority, then earlier in the queue."""
    assert 0 <= seq < 2**_ORDER_BITS
    return float(-priority * 2**_ORDER_BITS + seq)


class RunNotFound(KeyError):
    pass


class LimitReached(Exception):
    """A tenant's limit refuses the run (HTTP 429); `limit` names it."""

    def __init__(self, tenant: str, limit: str, value: int, count: int) -> None:
        super().__init__(f"tenant {tenant!r} is at its limit of queued runs ({limit} {value}, {count} queued); "
                         "wait for one to start or stop one")
        self.limit = limit


class AlreadyClaimed(Exception):
    """The event that would start the run has already started run `run_id`."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"already started run {run_id!r}")
        self.run_id = run_id


def new_run_id(name: str) -> str:
    """`<slug of name>-<time>-<hex>`: ASCII letters, digits, '-' and '_', starting with a letter or
    digit (a valid run id on shared storage for any name)."""
    slug = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "-" for c in name.lower())
    slug = slug[:40].strip("-_") or "run"
    return f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class RunStore:
    def __init__(self, client: aioredis.Redis) -> None:
        # Any: redis-py's return types are unions of bytes/str; decode_responses=True gives str.
        self.r: Any = client

    @classmethod
    def from_url(cls, url: str) -> RunStore:
        retry = Retry(ExponentialBackoff(cap=2.0, base=0.1), REDIS_RETRIES,
                      supported_errors=(RedisConnectionError, RedisTimeoutError))
        return cls(aioredis.from_url(url, decode_responses=True, retry=retry, health_check_interval=15,
                                     socket_connect_timeout=5, socket_keepalive=True))

    async def ping(self) -> bool:
        try:
            return bool(await self.r.ping())
        except (aioredis.ConnectionError, RedisTimeoutError, OSError):
            return False

    async def close(self) -> None:
        await self.r.aclose()

    def _key(self, run_id: str, suffix: str = "") -> str:
        return f"{PREFIX}run:{run_id}{':' + suffix if suffix else ''}"

    # runs -----------------------------------------------------------------------------------
    async def create_run(self, run_id: str, name: str, config: dict[str, Any], steps: int,
                         trigger: dict[str, Any] | None = None, claim: str = "", tenant: str = DEFAULT_TENANT,
                         priority: int = 0, max_queued: int = 0) -> dict[str, Any]:
        """Records a new run, queued (the scheduler starts it on a free learner pool). With `claim` (an
        event's dedupe key) the claim is written in the same transaction as the run, and AlreadyClaimed
        is raised, with nothing written, when another run holds it: a redelivered event starts no second
        run, and a crash leaves both or neither. With `max_queued`, LimitReached when the tenant has
        that many runs queued already."""
        now = time.time()
        seq = int(await self.r.incr(QUEUE_SEQ))
        record = {
            "id": run_id, "name": name, "state": RunState.QUEUED.value, "config": json.dumps(config),
            "step": 0, "steps": steps, "created_at": now, "updated_at": now, "failure_reason": "",
            "checkpoint_step": -1, "adapter_version": 0, "desired": "", "tenant": tenant, "priority": priority,
            "learner": "", "queued_seq": seq,
        }
        if trigger is not None:
            record["trigger"] = json.dumps(trigger)
        claim_key = self.claim_key(claim) if claim else ""

        async def write(pipe: Any) -> None:
            if claim_key:
                holder = await pipe.get(claim_key)  # WATCHed: immediate
                if holder:
                    raise AlreadyClaimed(holder)
            if max_queued:
                await self._check_queue_room(pipe, tenant, max_queued)
            pipe.multi()
            if claim_key:
                pipe.set(claim_key, run_id)
            pipe.hset(self._key(run_id), mapping=record)
            pipe.zadd(f"{PREFIX}runs", {run_id: now})
            pipe.zadd(QUEUE, {run_id: queue_score(priority, seq)})
            pipe.xadd(*self._event(run_id, "state", {"state": RunState.QUEUED.value}),
                      maxlen=EVENTS_MAXLEN, approximate=True)

        await self.r.transaction(write, *([claim_key] if claim_key else []), *([QUEUE] if max_queued else []))
        return await self.get_run(run_id)

    async def _check_queue_room(self, pipe: Any, tenant: str, max_queued: int) -> None:
        """LimitReached when `tenant` has `max_queued` runs queued (`pipe` WATCHes the queue, so a run
        queued meanwhile makes the transaction read again)."""
        ids = await pipe.zrange(QUEUE, 0, -1)
        tenants = [await pipe.hget(self._key(run_id), "tenant") for run_id in ids]
        count = sum((t or DEFAULT_TENANT) == tenant for t in tenants)
        if count >= max_queued:
            raise LimitReached(tenant, "max_queued", max_queued, count)

    def claim_key(self, claim: str) -> str:
        return f"{PREFIX}trigger:claim:{claim}"

    async def claimed_by(self, claim: str) -> str:
        """The run id that holds an event's dedupe key ('' when none does)."""
        return str(await self.r.get(self.claim_key(claim)) or "")

    async def get_run(self, run_id: str) -> dict[str, Any]:
        """The run, with its place in the queue (`queue_position`, 1 = next; None when not queued)."""
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._key(run_id))
            pipe.zrank(QUEUE, run_id)
            raw, rank = await pipe.execute()
        if not raw:
            raise RunNotFound(run_id)
        return _with_position(_decode_run(raw), None if rank is None else rank + 1)

    async def count_runs(self) -> int:
        return int(await self.r.zcard(f"{PREFIX}runs"))

    async def list_runs(self, offset: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Runs oldest first; `offset`/`limit` page through them. States and queue positions are read
        in one transaction: a snapshot, whatever the scheduler does meanwhile."""
        end = -1 if limit is None else offset + limit - 1
        ids = await self.r.zrange(f"{PREFIX}runs", offset, end) if limit != 0 else []
        return await self._snapshot(ids)

    async def queued_runs(self) -> list[dict[str, Any]]:
        """The queue, in the order its runs will start (queue_position 1, 2, ...)."""
        return sorted((run for run in await self._snapshot(await self.r.zrange(QUEUE, 0, -1))
                       if run["queue_position"] is not None), key=lambda run: run["queue_position"])

    async def _snapshot(self, ids: list[str]) -> list[dict[str, Any]]:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.zrange(QUEUE, 0, -1)
            for run_id in ids:
                pipe.hgetall(self._key(run_id))
            queue, *raws = await pipe.execute()
        positions = {run_id: index + 1 for index, run_id in enumerate(queue)}
        return [_with_position(_decode_run(raw), positions.get(raw["id"])) for raw in raws if raw]

    async def update_run(self, run_id: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        await self.r.hset(self._key(run_id), mapping={k: _encode(v) for k, v in fields.items()})

    async def set_state(self, run_id: str, state: RunState, reason: str = "") -> None:
        """Records `state` whatever the run's state was, with its event."""
        await self.change_run(run_id, lambda run: state_change(state, reason))

    async def change_run(self, run_id: str, decide: Callable[[dict[str, Any]], dict[str, Any]],
                         max_queued: int = 0) -> dict[str, Any]:
        """Reads the run and writes the fields `decide(run)` returns, in one optimistic transaction: if
        anything else writes the run in between (the run loop ending a step, another request, the
        scheduler starting it), the run is read again and `decide` called again, so a decision never
        rests on a stale state. What `decide` raises propagates with nothing written. Returns the fields
        written; with a "state" among them, the state event is added in the same transaction, and the
        queue follows the state: a run that becomes queued joins it at its back (of its priority), one
        that leaves it is removed, a queued one whose priority changes moves. With `max_queued`, a run
        that would join the queue while its tenant has that many there raises LimitReached."""
        key = self._key(run_id)
        seq = 0  # the queue order a run joining the queue gets (allocated once, gaps are harmless)

        async def read_decide_write(pipe: Any) -> dict[str, Any]:
            nonlocal seq
            raw = await pipe.hgetall(key)  # WATCHed: immediate
            if not raw:
                raise RunNotFound(run_id)
            run = _decode_run(raw)
            fields = decide(run)
            joins = fields.get("state", run["state"]) == RunState.QUEUED and run["state"] != RunState.QUEUED
            if joins:
                if max_queued:
                    await self._check_queue_room(pipe, run["tenant"], max_queued)
                seq = seq or int(await self.r.incr(QUEUE_SEQ))
                fields = {**fields, "queued_seq": seq, "learner": ""}
            after = {**run, **fields}
            pipe.multi()
            if fields:
                pipe.hset(key, mapping={k: _encode(v) for k, v in {**fields, "updated_at": time.time()}.items()})
            if after["state"] == RunState.QUEUED:
                pipe.zadd(QUEUE, {run_id: queue_score(int(after["priority"]), int(after["queued_seq"]))})
            elif run["state"] == RunState.QUEUED:
                pipe.zrem(QUEUE, run_id)
            if "state" in fields:
                pipe.xadd(*self._event(run_id, "state", {"state": fields["state"],
                                                         "reason": fields.get("failure_reason", "")}),
                          maxlen=EVENTS_MAXLEN, approximate=True)
            return fields

        watched = [key, QUEUE] if max_queued else [key]
        fields: dict[str, Any] = await self.r.transaction(read_decide_write, *watched, value_from_callable=True)
        return fields

    async def desired(self, run_id: str) -> str:
        return str(await self.r.hget(self._key(run_id), "desired") or "")

    # per-step records ---------------------------------------------------------------------------
    async def commit_step(self, run_id: str, step: int, metrics: dict[str, Any],
                          episodes: dict[str, dict[str, Any]]) -> None:
        """Records step `step` (1-based) atomically: its metrics, episodes, the step counter and,
        unless a first run of the step announced it already, its event."""
        await self._record(run_id, "metrics", step, metrics, episodes, advance_step=True, event="step")

    async def record_eval(self, run_id: str, step: int, summary: dict[str, Any],
                          episodes: dict[str, dict[str, Any]]) -> None:
        """Records the eval after step `step` atomically with its episodes (and its event, once)."""
        await self._record(run_id, "evals", step, summary, episodes, advance_step=False, event="eval")

    async def _record(self, run_id: str, suffix: str, step: int, record: dict[str, Any],
                      episodes: dict[str, dict[str, Any]], advance_step: bool, event: str) -> None:
        # One coordinator drives a run (its lease), so nothing else moves the mark in between.
        announced = await self.r.hget(self._key(run_id, "announced"), suffix)
        async with self.r.pipeline(transaction=True) as pipe:
            if announced is None or int(announced) < step:
                pipe.xadd(*self._event(run_id, event, record), maxlen=EVENTS_MAXLEN, approximate=True)
                pipe.hset(self._key(run_id, "announced"), suffix, step)
            pipe.hset(self._key(run_id, suffix), str(step), json.dumps(record))
            if episodes:
                pipe.hset(self._key(run_id, "episodes"), mapping={k: json.dumps(v) for k, v in episodes.items()})
            if advance_step:
                pipe.hset(self._key(run_id), mapping={"step": step, "updated_at": time.time()})
            await pipe.execute()

    async def truncate_after(self, run_id: str, step: int) -> None:
        """Forgets metrics, evals and episodes of steps after `step` (replayed after a resume)."""
        for suffix in ("metrics", "evals"):
            keys = [k for k in await self.r.hkeys(self._key(run_id, suffix)) if int(k) > step]
            if keys:
                await self.r.hdel(self._key(run_id, suffix), *keys)
        episodes = await self.r.hgetall(self._key(run_id, "episodes"))
        stale = [k for k, v in episodes.items() if json.loads(v).get("step", 0) > step]
        if stale:
            await self.r.hdel(self._key(run_id, "episodes"), *stale)

    async def metrics(self, run_id: str) -> list[dict[str, Any]]:
        return _sorted_by_step(await self.r.hgetall(self._key(run_id, "metrics")))

    async def evals(self, run_id: str) -> list[dict[str, Any]]:
        return _sorted_by_step(await self.r.hgetall(self._key(run_id, "evals")))

    async def episodes(self, run_id: str) -> list[dict[str, Any]]:
        raw = await self.r.hgetall(self._key(run_id, "episodes"))
        records = [json.loads(v) for v in raw.values()]
        return sorted(records, key=lambda e: (e.get("step", 0), e.get("kind", ""), e.get("id", "")))

    async def episode(self, run_id: str, episode_id: str) -> dict[str, Any] | None:
        raw = await self.r.hget(self._key(run_id, "episodes"), episode_id)
        return json.loads(raw) if raw else None

    # events ----------------------------------------------------------------------------------
    async def add_event(self, run_id: str, kind: str, data: dict[str, Any]) -> str:
        return str(await self.r.xadd(*self._event(run_id, kind, data), maxlen=EVENTS_MAXLEN, approximate=True))

    def _event(self, run_id: str, kind: str, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The stream key and entry of an event."""
        return self._key(run_id, "events"), {"kind": kind, "data": json.dumps(data), "ts": time.time()}

    async def read_events(self, run_id: str, after: str = "0", block_ms: int = 1000,
                          count: int = 100) -> list[tuple[str, dict[str, Any]]]:
        reply = await self.r.xread({self._key(run_id, "events"): after}, count=count, block=block_ms)
        events = []
        for _stream, entries in reply or []:
            for event_id, fields in entries:
                events.append((event_id, {"kind": fields["kind"], "data": json.loads(fields["data"]),
                                          "ts": float(fields["ts"])}))
        return events


def state_change(state: RunState, reason: str = "") -> dict[str, Any]:
    """The run fields that record `state`; a pause or an end serves the pending request."""
    fields: dict[str, Any] = {"state": state.value, "failure_reason": reason}
    if state in TERMINAL or state == RunState.PAUSED:
        fields["desired"] = ""
    return fields


def _encode(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


def _decode_run(raw: dict[str, str]) -> dict[str, Any]:
    return {
        "id": raw["id"], "name": raw["name"], "state": raw["state"], "config": json.loads(raw["config"]),
        "step": int(raw["step"]), "steps": int(raw["steps"]), "created_at": float(raw["created_at"]),
        "updated_at": float(raw["updated_at"]), "failure_reason": raw.get("failure_reason", ""),
        "checkpoint_step": int(raw.get("checkpoint_step", -1)),
        "adapter_version": int(raw.get("adapter_version", 0)), "desired": raw.get("desired", ""),
        "tenant": raw.get("tenant") or DEFAULT_TENANT, "priority": int(raw.get("priority", 0)),
        "learner": raw.get("learner", ""), "queued_seq": int(raw.get("queued_seq", 0)),
        "trigger": json.loads(raw["trigger"]) if raw.get("trigger") else None,
    }


def _with_position(run: dict[str, Any], position: int | None) -> dict[str, Any]:
    return {**run, "queue_position": position if run["state"] == RunState.QUEUED else None}


def _sorted_by_step(raw: dict[str, str]) -> list[dict[str, Any]]:
    return [json.loads(raw[k]) for k in sorted(raw, key=int)]
