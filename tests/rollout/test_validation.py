"""Request checks before the engine: every refusal names the request (and image/token) index."""

from __future__ import annotations

import pytest

from mmrl.models.tiny_adapter import frame_png
from mmrl_proto.v1 import common_pb2, rollout_pb2
from services.rollout.engine import ModelInfo
from services.rollout.errors import InvalidArgument
from services.rollout.frames import FrameCache
from services.rollout.validation import AdapterKey, parse_requests

INFO = ModelInfo("m", max_model_len=64, vocab_size=100, image_token_id=7, sleep_supported=False,
                 lora_supported=True)
PNG = frame_png(0)


def _request(prompt: list[int] | None = None, images: int = 1, **sampling: object) -> rollout_pb2.GenerationRequest:
    params = {"max_tokens": 4, **sampling}
    return rollout_pb2.GenerationRequest(
        prompt_token_ids=prompt if prompt is not None else [1, 2, 7, 3],
        images=[common_pb2.Image(data=PNG, mime_type="image/png") for _ in range(images)],
        sampling=rollout_pb2.SamplingParams(**params),  # type: ignore[arg-type]
    )


def _parse(*requests: rollout_pb2.GenerationRequest):  # type: ignore[no-untyped-def]
    return parse_requests(list(requests), INFO, max_requests=8, max_images=2, frames=FrameCache(2**20))


def test_a_valid_request_is_parsed_with_zero_meaning_default() -> None:
    (parsed,), (key,) = _parse(_request(temperature=0.0))
    assert parsed.prompt_token_ids == [1, 2, 7, 3]
    assert parsed.images[0].size == (80, 80) and parsed.images[0].mode == "RGB"
    assert parsed.image_ids == [FrameCache(0).decode(PNG).digest]
    s = parsed.sampling
    assert (s.temperature, s.top_p, s.top_k, s.n, s.seed, s.max_tokens) == (0.0, 1.0, 0, 1, None, 4)
    assert key is None


def test_a_seed_of_zero_is_a_seed_and_an_adapter_version_names_its_run() -> None:
    request = _request(seed=0)
    request.adapter_run_id, request.adapter_version = "run-a", 3
    (parsed,), (key,) = _parse(request)
    assert parsed.sampling.seed == 0
    assert key == AdapterKey("run-a", 3)


def test_a_token_outside_the_vocabulary_names_the_request_and_position() -> None:
    with pytest.raises(InvalidArgument, match=r"requests\[1\]\.prompt_token_ids\[2\]: token id 100 "):
        _parse(_request(), _request([1, 2, 100, 7]))
    with pytest.raises(InvalidArgument, match=r"requests\[0\]\.prompt_token_ids\[0\]: token id -1 "):
        _parse(_request([-1, 7]))


def test_an_image_that_does_not_decode_names_the_request_and_image() -> None:
    bad = _request([1, 7, 7], images=2)
    bad.images[1].data = b"\x89PNG not really"
    with pytest.raises(InvalidArgument, match=r"requests\[2\]\.images\[1\]: cannot decode 15 bytes \(image/png\)"):
        _parse(_request(), _request(), bad)


def test_an_already_expanded_prompt_is_refused_because_placeholders_and_images_differ() -> None:
    with pytest.raises(InvalidArgument, match=r"requests\[0\]: 3 image placeholder tokens .* but 1 images"):
        _parse(_request([1, 7, 7, 7, 2]))


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"requests\[0\]: prompt of 62 tokens plus max_tokens 4 exceeds"):
        _parse(_request([1] * 61 + [7]))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("temperature", -0.5, r"temperature must be in \[0, 2\]"),
    ("temperature", 2.5, r"temperature must be in \[0, 2\]"),
    ("temperature", float("nan"), r"temperature must be in \[0, 2\]"),
    ("temperature", float("inf"), r"temperature must be in \[0, 2\]"),
    ("top_p", 1.5, "top_p must be in"),
    ("top_k", -2, "top_k must be >= 0"),
    ("max_tokens", 0, "max_tokens must be >= 1"),
    ("n", -1, "n must be in"),
])
def test_bad_sampling_parameters_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"requests\[0\]\.sampling\.{message}"):
        _parse(_request(**{field: value}))


def test_greedy_sampling_asks_for_one_sample_and_stop_strings_are_not_empty() -> None:
    with pytest.raises(InvalidArgument, match=r"requests\[0\]\.sampling\.n must be 1 \(or 0\) when temperature is 0"):
        _parse(_request(temperature=0.0, n=4))
    assert _parse(_request(temperature=0.0, n=1))[0][0].sampling.n == 1
    request = _request()
    request.sampling.stop.extend(["\n", ""])
    with pytest.raises(InvalidArgument, match=r"requests\[0\]\.sampling\.stop: a stop string cannot be empty"):
        _parse(request)


def test_stop_token_ids_must_be_in_the_vocabulary() -> None:
    request = _request()
    request.sampling.stop_token_ids.append(100)
    with pytest.raises(InvalidArgument, match=r"stop_token_ids: 100 is outside"):
        _parse(request)


def test_an_adapter_version_needs_a_run_id_and_cannot_be_negative() -> None:
    request = _request()
    request.adapter_version = 2
    with pytest.raises(InvalidArgument, match=r"requests\[0\]: adapter_version 2 needs adapter_run_id"):
        _parse(request)
    request.adapter_version = -1
    with pytest.raises(InvalidArgument, match=r"adapter_version must be >= 0"):
        _parse(request)


def test_empty_and_oversized_batches_and_too_many_images_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="requests is empty"):
        _parse()
    with pytest.raises(InvalidArgument, match="9 requests in one call; at most 8"):
        _parse(*[_request() for _ in range(9)])
    with pytest.raises(InvalidArgument, match=r"requests\[0\]: 3 images; at most 2"):
        _parse(_request([7, 7, 7], images=3))
    with pytest.raises(InvalidArgument, match=r"requests\[0\]\.prompt_token_ids is empty"):
        _parse(_request([], images=0))
