"""An in-process stand-in for the vLLM engine, for the service's own logic (adapters, errors, health).

Generation is deterministic arithmetic, not a model: tests that claim generation works use the real
engine (test_vllm_*.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.common.adapter_probe import Probe
from services.rollout.engine import AdapterRef, Completion, EngineRequest, EngineResult, ModelInfo
from services.rollout.errors import FailedPrecondition, InvalidArgument, Unavailable

IMAGE_TOKEN = 5
TOKENS_PER_IMAGE = 4
PROBE_IDS = (11, 12, 13, 14, 15, 16)


def fake_logprobs(token_ids: Sequence[int], version: int) -> list[float]:
    """What `FakeEngine.score` answers: arithmetic, moved by 0.01 per adapter version (0: base)."""
    return [-((t % 7) + 1) / 4 - 0.01 * version for t in token_ids[1:]]


def fake_probe(version: int) -> dict[str, object]:
    """The manifest entry a learner would publish with `version` when the engine applies it."""
    return Probe(PROBE_IDS, tuple(fake_logprobs(PROBE_IDS, version)), tuple(fake_logprobs(PROBE_IDS, 0))).to_manifest()


class FakeEngine:
    def __init__(self, vocab_size: int = 512, max_model_len: int = 128, sleep_supported: bool = False,
                 lora_supported: bool = True) -> None:
        self._info = ModelInfo("fake", max_model_len, vocab_size, IMAGE_TOKEN, sleep_supported=sleep_supported,
                               lora_supported=lora_supported)
        self.adapters: dict[int, AdapterRef] = {}
        self.dead = False
        self.closed = False
        self.hold: asyncio.Event | None = None  # when set, generate waits for it (requests stay in flight)
        self.calls: list[list[EngineRequest]] = []
        self.sleep_levels: list[int] = []  # every level Sleep passed on (when sleep is supported)
        self.wake_ups = 0
        self.failing_removals: set[int] = set()  # lora_int_ids whose remove_adapter raises
        self.unapplied_versions: set[int] = set()  # adapter versions loaded but ignored when scoring

    @property
    def info(self) -> ModelInfo:
        return self._info

    async def generate(self, requests: Sequence[EngineRequest]) -> list[EngineResult]:
        if self.dead:
            raise Unavailable("fake engine is dead")
        self.calls.append(list(requests))
        results = []
        for index, request in enumerate(requests):
            assert request.adapter is None or request.adapter.lora_int_id in self.adapters, "unloaded adapter"
            expanded = [t for token in request.prompt_token_ids
                        for t in ([token] * TOKENS_PER_IMAGE if token == IMAGE_TOKEN else [token])]
            if len(expanded) + request.sampling.max_tokens > self._info.max_model_len:
                raise InvalidArgument(f"requests[{index}]: too long after expansion")
            offset = request.adapter.version if request.adapter else 0
            completions = [
                Completion([(sum(expanded) + offset + k + j) % self._info.vocab_size
                            for j in range(request.sampling.max_tokens)],
                           [-1.0] * request.sampling.max_tokens, "x", "length")
                for k in range(request.sampling.n)
            ]
            results.append(EngineResult(expanded, completions))
        if self.hold is not None:
            await self.hold.wait()
        return results

    async def score(self, token_ids: Sequence[int], adapter: AdapterRef | None) -> list[float]:
        assert adapter is None or adapter.lora_int_id in self.adapters, "unloaded adapter"
        applied = adapter is not None and adapter.version not in self.unapplied_versions
        return fake_logprobs(token_ids, adapter.version if applied else 0)  # type: ignore[union-attr]

    async def add_adapter(self, adapter: AdapterRef) -> None:
        self.adapters[adapter.lora_int_id] = adapter

    async def remove_adapter(self, adapter: AdapterRef) -> None:
        if adapter.lora_int_id in self.failing_removals:
            raise RuntimeError(f"fake engine cannot remove adapter {adapter.name}")
        del self.adapters[adapter.lora_int_id]

    async def loaded_adapter_ids(self) -> set[int]:
        return set(self.adapters)

    async def check_health(self) -> None:
        if self.dead:
            raise RuntimeError("fake engine is dead")

    async def sleep(self, level: int) -> None:
        if not self._info.sleep_supported:
            raise FailedPrecondition("sleep mode needs a GPU")
        self.sleep_levels.append(level)

    async def wake_up(self) -> None:
        if not self._info.sleep_supported:
            raise FailedPrecondition("sleep mode needs a GPU")
        self.wake_ups += 1

    async def shutdown(self) -> None:
        self.closed = True
