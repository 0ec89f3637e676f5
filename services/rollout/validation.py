"""Checks a Generate call's requests before anything reaches the engine.

Every refusal is an `InvalidArgument` whose message starts with the request's index
(`requests[3].images[0]: cannot decode ...`), so the caller knows which of its batch was wrong.
The engine checks the prompt length again after image expansion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mmrl_proto.v1 import common_pb2, rollout_pb2
from services.common.constrained import ActionMask
from services.rollout.engine import EngineRequest, ModelInfo, Sampling
from services.rollout.errors import InvalidArgument
from services.rollout.frames import Frame, FrameCache

MAX_SAMPLES_PER_REQUEST = 256
MAX_TEMPERATURE = 2.0  # vLLM's bound
MAX_MASK_TOKENS = 128  # vLLM's bound on logprob_token_ids: the constrained log-probs need them all


@dataclass(frozen=True)
class AdapterKey:
    run_id: str
    version: int


def parse_requests(
    requests: Sequence[rollout_pb2.GenerationRequest], info: ModelInfo, max_requests: int, max_images: int,
    frames: FrameCache,
) -> tuple[list[EngineRequest], list[AdapterKey | None]]:
    """Engine requests (adapter not yet resolved) and the adapter each one asks for (None: base);
    images are decoded through `frames`."""
    if not requests:
        raise InvalidArgument("requests is empty")
    if len(requests) > max_requests:
        raise InvalidArgument(f"{len(requests)} requests in one call; at most {max_requests}")
    parsed, keys = [], []
    for index, request in enumerate(requests):
        where = f"requests[{index}]"
        sampling = parse_sampling(request.sampling, info, where)
        prompt = list(request.prompt_token_ids)
        _check_prompt(prompt, sampling, info, where)
        decoded = _decode_images(request.images, prompt, info, max_images, frames, where)
        parsed.append(EngineRequest(prompt, sampling, [frame.image for frame in decoded],
                                    image_ids=[frame.digest for frame in decoded]))
        keys.append(_adapter_key(request, where))
    return parsed, keys


def parse_sampling(p: rollout_pb2.SamplingParams, info: ModelInfo, where: str) -> Sampling:
    """The proto's sampling parameters with zero meaning default (see rollout.proto). Also refuses what
    the engine would refuse (greedy with several samples, an empty stop string), so every engine gives
    the same INVALID_ARGUMENT."""
    if not (math.isfinite(p.temperature) and 0 <= p.temperature <= MAX_TEMPERATURE):
        raise InvalidArgument(f"{where}.sampling.temperature must be in [0, {MAX_TEMPERATURE:g}] (0 = greedy), "
                              f"got {p.temperature}")
    if not 0 <= p.top_p <= 1:
        raise InvalidArgument(f"{where}.sampling.top_p must be in [0, 1] (0 = no truncation), got {p.top_p}")
    if p.top_k < 0:
        raise InvalidArgument(f"{where}.sampling.top_k must be >= 0 (0 = no truncation), got {p.top_k}")
    if p.max_tokens < 1:
        raise InvalidArgument(f"{where}.sampling.max_tokens must be >= 1, got {p.max_tokens}")
    if not 0 <= p.n <= MAX_SAMPLES_PER_REQUEST:
        raise InvalidArgument(f"{where}.sampling.n must be in [0, {MAX_SAMPLES_PER_REQUEST}], got {p.n}")
    if p.temperature == 0 and p.n > 1:
        raise InvalidArgument(f"{where}.sampling.n must be 1 (or 0) when temperature is 0: greedy decoding "
                              f"gives one answer, got n={p.n}")
    if any(not stop for stop in p.stop):
        raise InvalidArgument(f"{where}.sampling.stop: a stop string cannot be empty")
    for token in p.stop_token_ids:
        if not 0 <= token < info.vocab_size:
            raise InvalidArgument(f"{where}.sampling.stop_token_ids: {token} is outside the vocabulary "
                                  f"[0, {info.vocab_size})")
    allowed = tuple(tuple(s.token_ids) for s in p.allowed_sequences)
    if allowed:
        try:
            mask = ActionMask(allowed)
        except ValueError as exc:
            raise InvalidArgument(f"{where}.sampling.allowed_sequences: {exc}") from None
        outside = [t for t in mask.tokens if not 0 <= t < info.vocab_size]
        if outside or len(mask.tokens) > MAX_MASK_TOKENS:
            raise InvalidArgument(f"{where}.sampling.allowed_sequences: at most {MAX_MASK_TOKENS} distinct tokens "
                                  f"of the vocabulary [0, {info.vocab_size}), got {len(mask.tokens)}"
                                  + (f" ({outside[0]} outside it)" if outside else ""))
    return Sampling(
        temperature=float(p.temperature),
        top_p=float(p.top_p) if p.top_p > 0 else 1.0,
        top_k=int(p.top_k),
        max_tokens=int(p.max_tokens),
        stop=tuple(p.stop),
        stop_token_ids=tuple(p.stop_token_ids),
        n=int(p.n) or 1,
        seed=int(p.seed) if p.HasField("seed") else None,
        allowed_sequences=allowed,
    )


def _check_prompt(prompt: list[int], sampling: Sampling, info: ModelInfo, where: str) -> None:
    if not prompt:
        raise InvalidArgument(f"{where}.prompt_token_ids is empty")
    for position, token in enumerate(prompt):
        if not 0 <= token < info.vocab_size:
            raise InvalidArgument(f"{where}.prompt_token_ids[{position}]: token id {token} is outside the "
                                  f"vocabulary [0, {info.vocab_size})")
    if len(prompt) + sampling.max_tokens > info.max_model_len:
        raise InvalidArgument(f"{where}: prompt of {len(prompt)} tokens plus max_tokens {sampling.max_tokens} "
                              f"exceeds the model's context of {info.max_model_len} tokens")


def _decode_images(images: Sequence[common_pb2.Image], prompt: list[int], info: ModelInfo, max_images: int,
                   frames: FrameCache, where: str) -> list[Frame]:
    if len(images) > max_images:
        raise InvalidArgument(f"{where}: {len(images)} images; at most {max_images} per prompt")
    if info.image_token_id is not None:
        num_placeholders = prompt.count(info.image_token_id)
        if num_placeholders != len(images):
            raise InvalidArgument(
                f"{where}: {num_placeholders} image placeholder tokens (id {info.image_token_id}) but "
                f"{len(images)} images; send exactly one placeholder per image, not expanded"
            )
    decoded = []
    for position, image in enumerate(images):
        data = image.data
        try:
            decoded.append(frames.decode(data))
        except Exception as exc:  # PIL raises many types for corrupt or unknown data
            mime = image.mime_type or "no mime_type"
            raise InvalidArgument(
                f"{where}.images[{position}]: cannot decode {len(data)} bytes ({mime}): {exc}"
            ) from exc
    return decoded


def _adapter_key(request: rollout_pb2.GenerationRequest, where: str) -> AdapterKey | None:
    if request.adapter_version < 0:
        raise InvalidArgument(f"{where}.adapter_version must be >= 0 (0 = base model), got "
                              f"{request.adapter_version}")
    if request.adapter_version == 0:
        return None
    if not request.adapter_run_id:
        raise InvalidArgument(f"{where}: adapter_version {request.adapter_version} needs adapter_run_id")
    return AdapterKey(request.adapter_run_id, int(request.adapter_version))
