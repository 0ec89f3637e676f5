"""Versioned LoRA adapters: verified loading, a retention window, and honest version reporting.

`LoadAdapter(run_id, version, path)`:
1. `path` (default: the canonical `<shared_root>/runs/<run>/adapters/v<NNNNNN>`) must resolve inside
   the shared root (else INVALID_ARGUMENT);
2. the directory is copied to a local cache and the *copy* is checked against its manifest (sha256
   of every file), so what vLLM reads is exactly what was verified, even if the shared copy changes
   later (mismatch: FAILED_PRECONDITION; nothing already loaded is touched);
3. the engine loads the copy, and the replica proves it applies it: the probe the learner wrote into
   the manifest is scored under the new version and under the base model and must match the
   learner's (services/common/adapter_probe.py; `adapter_probe` in the config). A mismatch unloads
   the version again and is a FAILED_PRECONDITION naming the replica and the version;
4. the newest K versions of each run stay loaded (K =
   `adapter_retention`), older ones are retired: new requests for them get NOT_FOUND, and they are
   unloaded from the engine as soon as no running request uses them.

The adapters of up to `max_adapter_runs` runs are kept at once (several learner pools share a
replica, each training its own run); loading a further run's retires the least recently loaded
run's. `ReleaseAdapters(run_id)` retires every version of a run that ended or paused, so its room
goes to the runs still sampling.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from services.common import adapter_probe, storage
from services.rollout import metrics
from services.rollout.engine import AdapterRef, Engine
from services.rollout.errors import FailedPrecondition, InvalidArgument, NotFound
from services.rollout.validation import AdapterKey

log = logging.getLogger("mmrl.rollout.adapters")


@dataclass
class LoadedAdapter:
    run_id: str
    version: int
    source: Path
    """The published directory it was loaded from."""
    manifest_sha256: str
    ref: AdapterRef
    """The engine's handle; `ref.path` is the verified local copy."""
    in_flight: int = 0
    retired: bool = False
    probe: adapter_probe.ProbeResult | None = None
    """What the adapter probe measured when it was loaded (None: not probed)."""


ProbeMode = Literal["required", "if_present", "off"]


@dataclass(frozen=True)
class ProbePolicy:
    mode: ProbeMode
    tolerance: float
    replica: str
    """This replica's name in error messages (host:port)."""


class AdapterRegistry:
    def __init__(self, engine: Engine, shared_root: Path, cache_dir: Path, retention: int, max_runs: int,
                 max_rank: int, probe: ProbePolicy, tower_lora: bool = False) -> None:
        assert retention >= 2 and max_runs >= 1
        self._engine = engine
        self._probe = probe
        self._shared_root = Path(shared_root)
        self._cache_dir = Path(cache_dir)
        self._retention = retention
        self._max_runs = max_runs
        self._max_rank = max_rank
        self._tower_lora = tower_lora
        self._live: dict[tuple[str, int], LoadedAdapter] = {}
        self._by_id: dict[int, LoadedAdapter] = {}
        self._runs: OrderedDict[str, None] = OrderedDict()  # least recently loaded first
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    def loaded(self) -> list[LoadedAdapter]:
        """Adapters that new requests may use, by run then version."""
        return sorted(self._live.values(), key=lambda a: (a.run_id, a.version))

    async def load(self, run_id: str, version: int, path: str = "") -> tuple[LoadedAdapter, float]:
        """Verifies and loads a published adapter; returns it and the milliseconds it took."""
        start = time.perf_counter()
        async with self._lock:
            source = self._source_dir(run_id, version, path)
            existing = self._live.get((run_id, version))
            if existing is not None:
                self._check_same(existing, source)
                return existing, (time.perf_counter() - start) * 1000
            self._check_not_too_old(run_id, version)
            adapter = await self._load_copy(run_id, version, source)
            self._live[(run_id, version)] = adapter
            self._by_id[adapter.ref.lora_int_id] = adapter
            self._runs[run_id] = None
            self._runs.move_to_end(run_id)
            await self._apply_retention(run_id)
        load_ms = (time.perf_counter() - start) * 1000
        log.info("adapter loaded", extra={"run_id": run_id, "version": version, "load_ms": round(load_ms, 1),
                                          "manifest_sha256": adapter.manifest_sha256})
        return adapter, load_ms

    def acquire(self, keys: Sequence[AdapterKey | None]) -> list[AdapterRef | None]:
        """The engine handle for each key (None: base model), held until `release`; NOT_FOUND if any
        version is not loaded."""
        for index, key in enumerate(keys):
            if key is not None and key not in self._live_keys():
                raise NotFound(self._not_found_message(index, key))
        refs: list[AdapterRef | None] = []
        for key in keys:
            if key is None:
                refs.append(None)
                continue
            adapter = self._live[(key.run_id, key.version)]
            adapter.in_flight += 1
            refs.append(adapter.ref)
        return refs

    async def release_run(self, run_id: str) -> int:
        """Retires every version of the run (unloaded once no request uses it); how many there were."""
        async with self._lock:
            adapters = [a for a in self._live.values() if a.run_id == run_id]
            for adapter in adapters:
                await self._retire(adapter)
            self._runs.pop(run_id, None)
        if adapters:
            log.info("run's adapters released", extra={"run_id": run_id, "versions": [a.version for a in adapters]})
        return len(adapters)

    async def release(self, refs: Sequence[AdapterRef | None]) -> None:
        """Ends the use `acquire` started: every count is decremented first, then each retired adapter
        that no request uses any more is unloaded."""
        unused = []
        for ref in refs:
            if ref is None:
                continue
            adapter = self._by_id[ref.lora_int_id]
            adapter.in_flight -= 1
            if adapter.retired and adapter.in_flight == 0:
                unused.append(adapter)
        for adapter in unused:
            await self._unload(adapter)

    async def close(self) -> None:
        for adapter in list(self._by_id.values()):
            shutil.rmtree(adapter.ref.path, ignore_errors=True)

    def _live_keys(self) -> set[AdapterKey]:
        return {AdapterKey(run_id, version) for run_id, version in self._live}

    def _not_found_message(self, index: int, key: AdapterKey) -> str:
        loaded = sorted(v for r, v in self._live if r == key.run_id)
        return (f"requests[{index}]: adapter {key.run_id!r} version {key.version} is not loaded "
                f"(loaded versions of that run: {loaded or 'none'}; older versions leave the window of "
                f"{self._retention})")

    def _source_dir(self, run_id: str, version: int, path: str) -> Path:
        try:
            storage.validate_run_id(run_id)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
        if version < 1:
            raise InvalidArgument(f"adapter version must be >= 1, got {version}")
        source = Path(path) if path else storage.adapter_dir(self._shared_root, run_id, version)
        if not source.is_absolute():
            source = self._shared_root / source
        if not storage.is_within(source, self._shared_root):
            raise InvalidArgument(f"adapter path {path!r} is outside the shared root {self._shared_root}")
        if not source.is_dir():
            raise NotFound(f"adapter directory {source} does not exist")
        if not (source / storage.MANIFEST).is_file():  # checked before anything is copied
            raise FailedPrecondition(f"{source} has no {storage.MANIFEST}: not a published adapter version")
        return source

    def _check_same(self, existing: LoadedAdapter, source: Path) -> None:
        try:
            sha = storage.manifest_sha256(source)
        except OSError as exc:
            raise FailedPrecondition(f"{source}: cannot read manifest: {exc}") from exc
        if sha != existing.manifest_sha256:
            raise FailedPrecondition(
                f"{existing.run_id} v{existing.version} is already loaded from a manifest with sha256 "
                f"{existing.manifest_sha256}; {source} has {sha} (published versions are immutable)"
            )

    def _check_not_too_old(self, run_id: str, version: int) -> None:
        newest = sorted((v for r, v in self._live if r == run_id), reverse=True)[: self._retention]
        if len(newest) == self._retention and version < newest[-1]:
            raise FailedPrecondition(
                f"{run_id} v{version} is older than the retention window (loaded: {sorted(newest)}, "
                f"keeping the newest {self._retention})"
            )

    async def _load_copy(self, run_id: str, version: int, source: Path) -> LoadedAdapter:
        copy = self._cache_dir / f"{run_id}-v{version:06d}-{uuid.uuid4().hex[:8]}"
        try:
            await asyncio.to_thread(shutil.copytree, source, copy)
            try:
                manifest = await asyncio.to_thread(storage.verify_manifest, copy)
            except storage.ManifestError as exc:
                message = str(exc).replace(str(copy), str(source))
                raise FailedPrecondition(f"adapter {run_id} v{version} refused: {message}") from exc
            self._check_rank(copy, source)
            self._check_tower(copy, source)
            probe = self._probe_of(manifest, run_id, version)
            ref = AdapterRef(name=f"{run_id}-v{version}", lora_int_id=next(self._ids), path=str(copy),
                             version=version)
            await self._engine.add_adapter(ref)
            checked = None
            if probe is not None:
                try:
                    checked = await self._check_probe(probe, ref, run_id)
                except BaseException:
                    await self._remove_quietly(ref, run_id)
                    raise
            return LoadedAdapter(run_id, version, source, storage.manifest_sha256(copy), ref, probe=checked)
        except (FileNotFoundError, shutil.Error) as exc:  # copytree gathers every file's error into shutil.Error
            shutil.rmtree(copy, ignore_errors=True)
            if source.is_dir():
                raise FailedPrecondition(f"adapter {run_id} v{version}: cannot copy {source}: {exc}") from exc
            raise NotFound(f"adapter directory {source} vanished while loading: {exc}") from exc
        except BaseException:
            shutil.rmtree(copy, ignore_errors=True)
            raise

    def _probe_of(self, manifest: dict[str, Any], run_id: str, version: int) -> adapter_probe.Probe | None:
        """The manifest's probe, or None where it is not checked; FAILED_PRECONDITION if it is required
        and missing, or malformed."""
        if self._probe.mode == "off":
            return None
        try:
            probe = adapter_probe.Probe.from_manifest(manifest)
        except ValueError as exc:
            raise FailedPrecondition(f"replica {self._probe.replica}: adapter {run_id} v{version}: {exc}") from exc
        if probe is None and self._probe.mode == "required":
            raise FailedPrecondition(
                f"replica {self._probe.replica}: adapter {run_id} v{version} has no probe in its manifest, so "
                "this replica cannot prove it applies it (the learner writes one with every version; "
                "adapter_probe: if_present loads versions without one unchecked)")
        if probe is not None and max(probe.token_ids) >= self._engine.info.vocab_size:
            raise FailedPrecondition(f"replica {self._probe.replica}: adapter {run_id} v{version}: the probe's "
                                     f"token ids exceed the vocabulary of {self._engine.info.vocab_size} (another "
                                     "base model?)")
        return probe

    async def _check_probe(self, probe: adapter_probe.Probe, ref: AdapterRef,
                           run_id: str) -> adapter_probe.ProbeResult:
        served = await self._engine.score(probe.token_ids, ref)
        base = await self._engine.score(probe.token_ids, None)
        result = adapter_probe.check(probe, served, base, self._probe.tolerance)
        metrics.adapter_probed(run_id, result.gap)
        log.info("adapter probe", extra={"run_id": run_id, "version": ref.version, "gap": result.gap,
                                         "learner_effect": result.learner_effect,
                                         "served_effect": result.served_effect,
                                         "distinguishable": result.distinguishable})
        problem = result.problem()
        if problem is not None:
            raise FailedPrecondition(f"replica {self._probe.replica}: adapter {run_id} v{ref.version} is not "
                                     f"served as the learner published it: {problem}")
        return result

    async def _remove_quietly(self, ref: AdapterRef, run_id: str) -> None:
        """Removes an adapter from the engine; an engine failure is logged, not raised."""
        try:
            await self._engine.remove_adapter(ref)
        except Exception as exc:
            log.error("adapter unload failed", extra={"run_id": run_id, "version": ref.version, "error": repr(exc)})

    def _check_rank(self, copy: Path, source: Path) -> None:
        try:
            rank = storage.adapter_rank(copy)
        except ValueError as exc:
            raise FailedPrecondition(str(exc).replace(str(copy), str(source))) from exc
        if rank > self._max_rank:
            raise FailedPrecondition(f"{source}: LoRA rank {rank} exceeds the service's max_lora_rank "
                                     f"{self._max_rank}")

    def _check_tower(self, copy: Path, source: Path) -> None:
        """An engine without tower LoRA would serve a vision-tower adapter's language-model part only,
        and the adapter probe (text) would not notice: refused here instead. Weights that cannot be read
        are left to the engine's load, which refuses them with its own reason."""
        if self._tower_lora:
            return
        try:
            vision = storage.adapter_vision_modules(copy)
        except ValueError:
            return
        if vision:
            raise FailedPrecondition(f"{source}: the adapter adapts the vision tower (e.g. {vision[0]!r}); this "
                                     "rollout service serves language-model adapters only (start it with "
                                     "--tower-lora; `mmrl up --tower-lora`)")

    async def _apply_retention(self, run_id: str) -> None:
        versions = sorted((a for a in self._live.values() if a.run_id == run_id), key=lambda a: -a.version)
        for adapter in versions[self._retention:]:
            await self._retire(adapter)
        while len(self._runs) > self._max_runs:
            oldest_run, _ = self._runs.popitem(last=False)
            for adapter in [a for a in self._live.values() if a.run_id == oldest_run]:
                await self._retire(adapter)

    async def _retire(self, adapter: LoadedAdapter) -> None:
        adapter.retired = True
        del self._live[(adapter.run_id, adapter.version)]
        log.info("adapter retired", extra={"run_id": adapter.run_id, "version": adapter.version,
                                           "in_flight": adapter.in_flight})
        if adapter.in_flight == 0:
            await self._unload(adapter)

    async def _unload(self, adapter: LoadedAdapter) -> None:
        """Removes a retired adapter from the engine and deletes its local copy. An engine failure is
        logged, not raised: the requests or the load that led here have already succeeded."""
        self._by_id.pop(adapter.ref.lora_int_id, None)
        await self._remove_quietly(adapter.ref, adapter.run_id)
        shutil.rmtree(adapter.ref.path, ignore_errors=True)
