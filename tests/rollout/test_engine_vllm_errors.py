"""How `VllmEngine` reports what vLLM signals without a usable answer: sampling parameters vLLM refuses,
a request vLLM ended by aborting or failing it, and a dead engine core. vLLM's AsyncLLM is replaced by
a stub that raises vLLM's own exceptions and returns its output shapes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from services.rollout.config import RolloutConfig
from services.rollout.engine import AdapterRef, EngineRequest, Sampling
from services.rollout.engine_vllm import VllmEngine
from services.rollout.errors import FailedPrecondition, InvalidArgument, Unavailable


class StubLLM:
    model_config = SimpleNamespace(max_model_len=128, get_vocab_size=lambda: 512, hf_config=SimpleNamespace())
    errored = False

    def __init__(self, finish_reason: str = "stop", failure: BaseException | None = None) -> None:
        self.finish_reason = finish_reason
        self.failure = failure
        self.renderer = SimpleNamespace(render_cmpl_async=self._render)

    async def _render(self, prompts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return prompts

    async def generate(self, prompt: Any, params: Any, request_id: str, lora_request: Any) -> AsyncIterator[Any]:
        logprobs = [{7: SimpleNamespace(logprob=-0.5)}, {8: SimpleNamespace(logprob=-0.25)}]
        completion = SimpleNamespace(index=0, token_ids=[7, 8], logprobs=logprobs, text="up",
                                     finish_reason=self.finish_reason)
        yield SimpleNamespace(finished=True, outputs=[completion], prompt_token_ids=[1, 2], num_cached_tokens=None)

    async def add_lora(self, request: Any) -> bool:
        if self.failure is not None:
            raise self.failure
        return True

    async def sleep(self, level: int) -> None:
        if self.failure is not None:
            raise self.failure


def _engine(llm: StubLLM) -> VllmEngine:
    engine = VllmEngine(llm, RolloutConfig(model="stub"))
    engine._info = dataclasses.replace(engine.info, sleep_supported=True)
    return engine


def _request(**sampling: Any) -> EngineRequest:
    return EngineRequest([1, 2], Sampling(max_tokens=2, **sampling), [])


async def test_sampling_parameters_vllm_refuses_are_an_invalid_argument() -> None:
    # vLLM's VLLMValidationError is not a ValueError; it names the request all the same
    with pytest.raises(InvalidArgument, match=r"requests\[1\]\.sampling: .*n must be 1 when using greedy"):
        await _engine(StubLLM()).generate([_request(), _request(temperature=0.0, n=4)])


async def test_an_aborted_or_failed_request_is_an_error_not_a_truncated_answer() -> None:
    assert (await _engine(StubLLM("length")).generate([_request()]))[0].completions[0].token_ids == [7, 8]
    with pytest.raises(Unavailable, match=r"requests\[0\]: the engine aborted the generation after 2 tokens"):
        await _engine(StubLLM("abort")).generate([_request()])
    with pytest.raises(Exception, match=r"requests\[0\]: the engine failed the generation") as info:
        await _engine(StubLLM("error")).generate([_request()])
    assert info.value.code.name == "INTERNAL"  # type: ignore[attr-defined]


async def test_a_dead_engine_core_is_unavailable_and_other_failures_name_the_operation() -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    adapter = AdapterRef(name="run-v1", lora_int_id=1, path="/tmp/a", version=1)
    with pytest.raises(Unavailable, match=r"has died \(loading adapter run-v1\)"):
        await _engine(StubLLM(failure=EngineDeadError())).add_adapter(adapter)
    with pytest.raises(Unavailable, match=r"has died \(Sleep\)"):
        await _engine(StubLLM(failure=EngineDeadError())).sleep(1)
    with pytest.raises(FailedPrecondition, match="vLLM failed at loading adapter run-v1: bad weights"):
        await _engine(StubLLM(failure=RuntimeError("bad weights"))).add_adapter(adapter)


class DyingLLM(StubLLM):
    """An engine core that dies while calls to it are under way: vLLM never answers such a call."""

    def __init__(self) -> None:
        super().__init__()
        self.errored = False

    async def _never(self, *args: Any) -> Any:
        await asyncio.Event().wait()

    add_lora = is_sleeping = list_loras = _never  # type: ignore[assignment]

    async def check_health(self) -> None:  # vLLM's: reads the engine-dead flag, no round trip
        if self.errored:
            raise RuntimeError("dead")

    async def die_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.errored = True


async def test_a_call_under_way_when_the_engine_core_dies_ends_instead_of_waiting_for_ever() -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    llm = DyingLLM()
    engine = _engine(llm)
    adapter = AdapterRef(name="run-v1", lora_int_id=1, path="/tmp/a", version=1)
    dying = asyncio.ensure_future(llm.die_after(0.3))
    started = time.monotonic()
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(engine.check_health(), 10)  # the service's health probe: NOT_SERVING
    with pytest.raises(Unavailable, match=r"has died \(loading adapter run-v1\)"):
        await asyncio.wait_for(engine.add_adapter(adapter), 10)
    assert time.monotonic() - started < 5
    await dying


async def test_a_call_the_engine_answers_returns_its_answer() -> None:
    llm = StubLLM()
    llm.list_loras = _answer_after({1, 2}, 0.6)  # type: ignore[attr-defined]
    assert await _engine(llm).loaded_adapter_ids() == {1, 2}


def _answer_after(answer: Any, seconds: float) -> Any:
    async def call(*args: Any) -> Any:
        await asyncio.sleep(seconds)
        return answer
    return call
