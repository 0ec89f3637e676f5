"""`VllmEngine.start` without a model: vLLM's AsyncLLM is replaced by a stub that records shutdown."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from services.rollout import engine_vllm
from services.rollout.config import RolloutConfig
from services.rollout.engine_vllm import VllmEngine


class StubLLM:
    model_config = SimpleNamespace(max_model_len=128, get_vocab_size=lambda: 512, hf_config=SimpleNamespace())

    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


async def test_a_failed_warm_up_shuts_the_started_engine_down(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = StubLLM()
    monkeypatch.setattr(engine_vllm, "engine_args", lambda config: None)
    monkeypatch.setattr(AsyncLLM, "from_engine_args", lambda args: llm)

    async def failing_warm_up(self: Any, with_image: bool) -> None:
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(VllmEngine, "warm_up", failing_warm_up)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        await VllmEngine.start(RolloutConfig(model="stub"))
    assert llm.shut_down
