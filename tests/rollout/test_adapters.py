"""The adapter registry with an in-process engine: verification, the retention window, in-flight use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common import storage
from services.common.adapter_probe import Probe
from services.rollout.adapters import AdapterRegistry, ProbePolicy
from services.rollout.errors import FailedPrecondition, InvalidArgument, NotFound
from services.rollout.validation import AdapterKey
from tests.rollout.fake_engine import PROBE_IDS, FakeEngine, fake_logprobs, fake_probe

PROBE = ProbePolicy("required", tolerance=0.001, replica="replica-a:50052")


def publish(root: Path, run_id: str, version: int, rank: int = 8, payload: bytes = b"weights",
            probe: dict[str, object] | None = None) -> Path:
    """A published version whose manifest carries the probe the fake engine answers for it (or `probe`)."""

    def write(tmp: Path) -> None:
        (tmp / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
        (tmp / "adapter_model.safetensors").write_bytes(payload + bytes([version]))

    target = storage.adapter_dir(root, run_id, version)
    storage.publish_directory(target, write, fake_probe(version) if probe is None else probe)
    return target


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    root = tmp_path / "shared"
    root.mkdir()
    return root


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def registry(engine: FakeEngine, shared: Path, tmp_path: Path) -> AdapterRegistry:
    cache = tmp_path / "cache"
    cache.mkdir()
    return AdapterRegistry(engine, shared, cache, retention=2, max_runs=2, max_rank=16, probe=PROBE)


def _loaded(registry: AdapterRegistry) -> list[tuple[str, int]]:
    return [(a.run_id, a.version) for a in registry.loaded()]


async def test_loading_verifies_the_manifest_and_loads_a_local_copy(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path) -> None:
    source = publish(shared, "run", 1)
    adapter, load_ms = await registry.load("run", 1, str(source))
    assert adapter.manifest_sha256 == storage.manifest_sha256(source)
    assert load_ms > 0
    (ref,) = engine.adapters.values()
    assert ref.name == "run-v1" and ref.version == 1
    assert not storage.is_within(Path(ref.path), shared)  # vLLM reads the verified copy
    storage.verify_manifest(Path(ref.path))


async def test_an_empty_path_means_the_canonical_version_directory(registry: AdapterRegistry, shared: Path) -> None:
    publish(shared, "run", 4)
    adapter, _ = await registry.load("run", 4, "")
    assert adapter.source == storage.adapter_dir(shared, "run", 4)


async def test_a_path_outside_the_shared_root_is_an_invalid_argument(
        registry: AdapterRegistry, shared: Path, tmp_path: Path) -> None:
    outside = publish(tmp_path / "elsewhere", "run", 1)
    with pytest.raises(InvalidArgument, match="outside the shared root"):
        await registry.load("run", 1, str(outside))
    with pytest.raises(InvalidArgument, match="outside the shared root"):
        await registry.load("run", 1, str(shared / ".." / "elsewhere" / "runs" / "run" / "adapters" / "v000001"))
    (shared / "link").symlink_to(outside)
    with pytest.raises(InvalidArgument, match="outside the shared root"):
        await registry.load("run", 1, str(shared / "link"))
    with pytest.raises(InvalidArgument, match="run_id"):
        await registry.load("../etc", 1, "")


async def test_a_missing_directory_is_not_found(registry: AdapterRegistry, shared: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        await registry.load("run", 9, "")


async def test_a_directory_without_a_manifest_is_refused_before_anything_is_copied(
        registry: AdapterRegistry, shared: Path, tmp_path: Path) -> None:
    publish(shared, "run", 1)
    with pytest.raises(FailedPrecondition, match="runs/run has no manifest.json: not a published adapter"):
        await registry.load("run", 1, "runs/run")  # the whole run, not one of its versions
    assert list((tmp_path / "cache").iterdir()) == []
    assert _loaded(registry) == []


async def test_a_tampered_adapter_is_refused_and_the_previous_version_stays_loaded(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path, tmp_path: Path) -> None:
    publish(shared, "run", 1)
    await registry.load("run", 1, "")
    tampered = publish(shared, "run", 2)
    (tampered / "adapter_model.safetensors").write_bytes(b"evil")
    with pytest.raises(FailedPrecondition, match=r"run v2 refused: .*v000002/adapter_model.safetensors: sha256"):
        await registry.load("run", 2, "")
    assert _loaded(registry) == [("run", 1)]
    assert len(engine.adapters) == 1
    assert list((tmp_path / "cache").iterdir()) == [Path(next(iter(engine.adapters.values())).path)]
    (ref,) = registry.acquire([AdapterKey("run", 1)])
    assert ref is not None and ref.version == 1


async def test_the_retention_window_keeps_the_newest_k_versions(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path, tmp_path: Path) -> None:
    for version in (1, 2, 3, 4):
        publish(shared, "run", version)
        await registry.load("run", version, "")
    assert _loaded(registry) == [("run", 3), ("run", 4)]
    assert sorted(ref.version for ref in engine.adapters.values()) == [3, 4]
    assert len(list((tmp_path / "cache").iterdir())) == 2
    with pytest.raises(NotFound, match=r"requests\[1\]: adapter 'run' version 2 is not loaded .*\[3, 4\]"):
        registry.acquire([AdapterKey("run", 4), AdapterKey("run", 2)])
    with pytest.raises(FailedPrecondition, match="older than the retention window"):
        await registry.load("run", 1, "")


async def test_a_retired_version_still_in_use_is_unloaded_when_its_requests_finish(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path) -> None:
    for version in (1, 2):
        publish(shared, "run", version)
        await registry.load("run", version, "")
    refs = registry.acquire([AdapterKey("run", 1), None])
    publish(shared, "run", 3)
    await registry.load("run", 3, "")
    assert _loaded(registry) == [("run", 2), ("run", 3)]
    assert sorted(ref.version for ref in engine.adapters.values()) == [1, 2, 3]  # v1 still running
    await registry.release(refs)
    assert sorted(ref.version for ref in engine.adapters.values()) == [2, 3]


async def test_loading_a_version_again_is_idempotent_but_a_different_manifest_is_refused(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path) -> None:
    publish(shared, "run", 1)
    first, _ = await registry.load("run", 1, "")
    again, _ = await registry.load("run", 1, "")
    assert again is first and len(engine.adapters) == 1
    other = publish(shared / "other", "run", 1, payload=b"different")
    with pytest.raises(FailedPrecondition, match="already loaded from a manifest"):
        await registry.load("run", 1, str(other))


async def test_a_further_run_beyond_max_runs_unloads_the_least_recently_loaded_run(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path) -> None:
    for run_id in ("a", "b", "c"):
        publish(shared, run_id, 1)
        await registry.load(run_id, 1, "")
    assert _loaded(registry) == [("b", 1), ("c", 1)]
    assert sorted(ref.name for ref in engine.adapters.values()) == ["b-v1", "c-v1"]


async def test_a_released_run_leaves_its_room_to_the_runs_still_sampling(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path) -> None:
    for run_id, version in (("a", 1), ("a", 2), ("b", 1)):
        publish(shared, run_id, version)
        await registry.load(run_id, version, "")
    [ref] = registry.acquire([AdapterKey("a", 2)])  # a request still running with a's newest version
    assert await registry.release_run("a") == 2 and await registry.release_run("nobody") == 0
    assert _loaded(registry) == [("b", 1)]
    assert sorted(r.name for r in engine.adapters.values()) == ["a-v2", "b-v1"]  # a-v2 until its request ends
    await registry.release([ref])
    assert sorted(r.name for r in engine.adapters.values()) == ["b-v1"]
    publish(shared, "c", 1)
    await registry.load("c", 1, "")  # the third run fits beside b: nothing of b's goes
    assert _loaded(registry) == [("b", 1), ("c", 1)]


async def test_an_adapter_of_too_large_a_rank_is_refused(registry: AdapterRegistry, shared: Path) -> None:
    publish(shared, "run", 1, rank=32)
    with pytest.raises(FailedPrecondition, match="LoRA rank 32 exceeds the service's max_lora_rank 16"):
        await registry.load("run", 1, "")
    assert registry.loaded() == []


async def test_a_vision_tower_adapter_is_refused_unless_the_service_serves_tower_lora(
        engine: FakeEngine, shared: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    def publish_weights(run_id: str, names: list[str]) -> None:
        def write(tmp: Path) -> None:
            (tmp / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
            save_file({name: torch.zeros(8, 4) for name in names}, str(tmp / "adapter_model.safetensors"))

        storage.publish_directory(storage.adapter_dir(shared, run_id, 1), write, fake_probe(1))

    language = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"
    tower = "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight"
    publish_weights("lm", [language])
    publish_weights("tower", [language, tower])
    (tmp_path / "cache").mkdir()
    plain = AdapterRegistry(engine, shared, tmp_path / "cache", retention=2, max_runs=2, max_rank=16, probe=PROBE)
    await plain.load("lm", 1, "")
    with pytest.raises(FailedPrecondition, match=r"adapts the vision tower \(e\.g\. '.*visual\.blocks\.0\.attn\.qkv.*"
                                                 r"--tower-lora"):
        await plain.load("tower", 1, "")
    assert _loaded(plain) == [("lm", 1)]
    served = AdapterRegistry(engine, shared, tmp_path / "cache", retention=2, max_runs=2, max_rank=16, probe=PROBE,
                             tower_lora=True)
    await served.load("tower", 1, "")
    assert _loaded(served) == [("tower", 1)]


@pytest.mark.parametrize("config", [
    [8], {"r": "x"}, {"r": None}, {"r": 8, "rank_pattern": [4]}, {"r": 8, "rank_pattern": {"q_proj": "big"}},
])
async def test_a_malformed_adapter_config_is_a_failed_precondition(
        registry: AdapterRegistry, shared: Path, config: object) -> None:
    def write(tmp: Path) -> None:
        (tmp / "adapter_config.json").write_text(json.dumps(config))
        (tmp / "adapter_model.safetensors").write_bytes(b"weights")

    storage.publish_directory(storage.adapter_dir(shared, "run", 1), write)
    with pytest.raises(FailedPrecondition, match="adapter_config.json must be a readable object with an integer 'r'"):
        await registry.load("run", 1, "")
    assert registry.loaded() == []


async def test_releasing_decrements_every_count_before_unloading_and_survives_a_failed_unload(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path) -> None:
    for version in (1, 2):
        publish(shared, "run", version)
        await registry.load("run", version, "")
    refs = registry.acquire([AdapterKey("run", 1), AdapterKey("run", 2)])
    for version in (3, 4):
        publish(shared, "run", version)
        await registry.load("run", version, "")
    assert refs[0] is not None
    engine.failing_removals.add(refs[0].lora_int_id)
    await registry.release(refs)
    assert sorted(ref.version for ref in engine.adapters.values()) == [1, 3, 4]  # v1's removal failed, v2 went


async def test_a_version_the_engine_does_not_apply_is_refused_naming_the_replica_and_unloaded(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path, tmp_path: Path) -> None:
    publish(shared, "run", 1)
    await registry.load("run", 1, "")
    engine.unapplied_versions.add(2)  # the engine takes the adapter but answers with the base model
    publish(shared, "run", 2)
    with pytest.raises(FailedPrecondition, match=r"replica replica-a:50052: adapter run v2 is not served as the "
                                                 r"learner published it: .*differ from the learner's"):
        await registry.load("run", 2, "")
    assert _loaded(registry) == [("run", 1)]  # the previous version keeps serving
    assert [ref.version for ref in engine.adapters.values()] == [1]
    assert len(list((tmp_path / "cache").iterdir())) == 1  # the refused copy is deleted


async def test_an_adapter_swapped_under_its_manifest_is_refused(
        registry: AdapterRegistry, shared: Path) -> None:
    # Version 2's files with version 1's probe: the manifest is consistent, the weights are not what was trained.
    publish(shared, "run", 2, probe=fake_probe(1))
    with pytest.raises(FailedPrecondition, match=r"replica replica-a:50052: adapter run v2 .* differ from the "
                                                 r"learner's by 0.01 per token on average \(tolerance 0.001\)"):
        await registry.load("run", 2, "")
    assert registry.loaded() == []


async def test_an_engine_ignoring_the_adapter_is_refused_even_where_its_base_matches_the_adapter(
        registry: AdapterRegistry, engine: FakeEngine, shared: Path) -> None:
    # The engine ignores the adapter, and its base model answers what the learner's adapter does (another base
    # model than the learner's): the served log-probs match, but they do not move from the base's.
    base = fake_logprobs(PROBE_IDS, 0)
    learner = Probe(PROBE_IDS, tuple(base), tuple(v + 0.5 for v in base))
    engine.unapplied_versions.add(1)
    publish(shared, "run", 1, probe=learner.to_manifest())
    with pytest.raises(FailedPrecondition, match=r"answers like the base model \(adapter moves the probe by 0 per "
                                                 r"token, the learner's by 0.5\): the adapter is not applied"):
        await registry.load("run", 1, "")


async def test_a_version_without_a_probe_is_refused_unless_the_policy_allows_it(
        engine: FakeEngine, shared: Path, tmp_path: Path) -> None:
    def write(tmp: Path) -> None:
        (tmp / "adapter_config.json").write_text(json.dumps({"r": 8}))
        (tmp / "adapter_model.safetensors").write_bytes(b"weights")

    storage.publish_directory(storage.adapter_dir(shared, "run", 1), write)
    storage.publish_directory(storage.adapter_dir(shared, "run", 2), write, {"probe": {"token_ids": [1]}})
    for mode, loads in (("required", False), ("if_present", True), ("off", True)):
        cache = tmp_path / f"cache-{mode}"
        cache.mkdir()
        registry = AdapterRegistry(engine, shared, cache, retention=2, max_runs=2, max_rank=16,
                                   probe=ProbePolicy(mode, 0.001, "replica-a:50052"))  # type: ignore[arg-type]
        if loads:
            await registry.load("run", 1, "")
        else:
            with pytest.raises(FailedPrecondition, match="run v1 has no probe in its manifest"):
                await registry.load("run", 1, "")
        if mode == "off":
            await registry.load("run", 2, "")
        else:  # a malformed probe is refused whenever probes are checked
            with pytest.raises(FailedPrecondition, match="malformed adapter probe"):
                await registry.load("run", 2, "")
        await registry.close()
