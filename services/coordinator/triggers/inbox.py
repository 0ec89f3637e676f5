"""The watched directory: a run config file dropped into <shared_root>/inbox/ starts a run.

Each scan claims a file by renaming it into inbox/processing/ (atomic: of two coordinators, one
gets it), starts its run, then moves it to inbox/started/ or to inbox/rejected/ beside a
<name>.reason.txt. Files a stopped coordinator left in processing/ are taken up first by the next
scan; the dedupe key (file name, content hash, modification time, which a rename keeps) makes a file
whose run was started before the stop go to started/ without a second run. Names starting with '.'
or ending in .tmp, .part or .swp are left alone (write under such a name, then rename)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from pathlib import Path

from redis.exceptions import RedisError

from services.coordinator.triggers.audit import TriggerOutcome
from services.coordinator.triggers.dispatch import Triggers
from services.coordinator.triggers.events import ObjectEvent

log = logging.getLogger("mmrl.coordinator.inbox")
IN_PROGRESS = (".tmp", ".part", ".swp")


class Inbox:
    def __init__(self, root: Path, triggers: Triggers, settle_s: float = 1.0) -> None:
        self.root = Path(root)
        self.processing, self.started, self.rejected = (self.root / d for d in ("processing", "started", "rejected"))
        self.triggers = triggers
        self.settle_s = settle_s  # a file younger than this may still be being written

    def make_dirs(self) -> None:
        for directory in (self.root, self.processing, self.started, self.rejected):
            directory.mkdir(parents=True, exist_ok=True)

    async def watch(self, poll_s: float) -> None:
        """Scans every `poll_s` seconds until cancelled; a scan that fails (Redis down) is logged and
        its files wait in processing/ for the next."""
        self.make_dirs()
        while True:
            try:
                await self.scan()
            except (RedisError, OSError) as exc:
                log.warning("inbox scan failed; retrying", extra={"inbox": str(self.root), "error": str(exc)})
            await asyncio.sleep(poll_s)

    async def scan(self) -> list[TriggerOutcome]:
        """Processes what a stopped coordinator left in processing/, then every new file."""
        outcomes = [await self._process(path) for path in _files(self.processing)]
        now = time.time()
        for path in _files(self.root):
            if path.name.startswith(".") or path.name.endswith(IN_PROGRESS):
                continue
            try:
                if now - path.stat().st_mtime < self.settle_s:
                    continue
                claimed = self.processing / path.name
                if claimed.exists():  # a file of that name is being processed: take this one next time
                    continue
                os.rename(path, claimed)
            except FileNotFoundError:  # another coordinator claimed it
                continue
            outcomes.append(await self._process(claimed))
        return [o for o in outcomes if o is not None]

    async def _process(self, path: Path) -> TriggerOutcome | None:
        try:
            data = path.read_bytes()
            mtime_ns = path.stat().st_mtime_ns
        except FileNotFoundError:  # another coordinator finished it
            return None
        digest = hashlib.sha256(data).hexdigest()
        event = ObjectEvent(source="inbox", bucket="", key=path.name, version=f"{digest}@{mtime_ns}",
                            etag=digest, size=len(data),
                            time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime_ns / 1e9)))
        outcome = await self.triggers.config_file(event, data)
        if outcome.outcome == "rejected":
            target = _free_name(self.rejected, path.name)
            reason = target.with_name(target.name + ".reason.txt")
            written = reason.with_name(f".{reason.name}.tmp")
            written.write_text(outcome.reason + "\n")
            os.rename(written, reason)  # whole: a reader never sees it half written
        else:
            target = _free_name(self.started, path.name)
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return None
        log.info("inbox file processed", extra={"file": path.name, "outcome": outcome.outcome,
                                                "run_id": outcome.run_id, "moved_to": str(target)})
        return outcome


def _files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.is_file())
    except FileNotFoundError:
        return []


def _free_name(directory: Path, name: str) -> Path:
    """directory/name, or directory/<stem>.1<suffix>, .2 ... when taken (an earlier file of the same name)."""
    target, n = directory / name, 0
    while target.exists() or target.with_name(target.name + ".reason.txt").exists():
        n += 1
        target = directory / f"{Path(name).stem}.{n}{Path(name).suffix}"
    return target
