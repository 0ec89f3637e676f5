"""The engine boundary: what the rollout service needs from an inference engine.

`Engine` is the interface; `services.rollout.engine_vllm.VllmEngine` implements it with vLLM
(imported lazily, so this module stays light). Tests use an in-process fake for the service's own
logic and the real vLLM engine for every check that claims generation works.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters with the proto's zero-means-default values already resolved."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k truncation
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    seed: int | None = None
    allowed_sequences: tuple[tuple[int, ...], ...] = ()
    """Constrained actions: the mask's sequences (services/common/constrained.py); () = free text."""


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter as the engine knows it: a unique name and integer id, and its local files."""

    name: str
    lora_int_id: int
    path: str
    version: int


@dataclass(frozen=True)
class EngineRequest:
    """One prompt: compact token ids (one placeholder per image), decoded images, sampling, adapter."""

    prompt_token_ids: list[int]
    sampling: Sampling
    images: list[Image.Image] = field(default_factory=list)
    adapter: AdapterRef | None = None
    image_ids: list[str] = field(default_factory=list)
    """Content digests of `images`, in order (services/rollout/frames.py); empty: not known. An engine
    may take them for the images' identity (vLLM: `multi_modal_uuids`) instead of hashing pixels."""


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each sampled token (same length as token_ids)."""
    text: str
    finish_reason: str


@dataclass(frozen=True)
class EngineResult:
    prompt_token_ids: list[int]
    """The prompt as the engine conditioned on it, image placeholders expanded."""
    completions: list[Completion]
    num_cached_tokens: int = 0
    """Prompt tokens whose KV cache came from earlier requests (prefix caching)."""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int
    vocab_size: int
    image_token_id: int | None
    sleep_supported: bool
    lora_supported: bool
    # Multimodal placeholder tokens (image/video pads, vision start/end). They are never sampled: a
    # generated placeholder would make the next turn's prompt claim an image that is not there.
    placeholder_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"
    """What the engine computes in ("float32", "bfloat16", "float16")."""


class Engine(Protocol):
    """An inference engine with versioned LoRA adapters.

    `generate` runs all requests concurrently (continuous batching) and returns one result per
    request, in order. For a request the engine cannot take it raises `errors.InvalidArgument`
    naming the request index ("requests[3]: ..."); other requests of the call may already have
    started by then and are aborted (the vLLM engine submits each one as soon as it is rendered).
    It raises `errors.Unavailable` when the engine is dead.
    """

    @property
    def info(self) -> ModelInfo: ...

    async def generate(self, requests: Sequence[EngineRequest]) -> list[EngineResult]: ...

    async def score(self, token_ids: Sequence[int], adapter: AdapterRef | None) -> list[float]:
        """Log-prob of each of `token_ids[1:]` given the tokens before it (text only), under `adapter`
        or the base model: the adapter probe's measurement (services/common/adapter_probe.py)."""
        ...

    async def add_adapter(self, adapter: AdapterRef) -> None: ...

    async def remove_adapter(self, adapter: AdapterRef) -> None: ...

    async def loaded_adapter_ids(self) -> set[int]:
        """The `lora_int_id`s the engine itself holds (to check that unloading really frees them)."""
        ...

    async def check_health(self) -> None:
        """Returns when the engine answers; raises when it is dead or does not respond."""
        ...

    async def sleep(self, level: int) -> None: ...

    async def wake_up(self) -> None: ...

    async def shutdown(self) -> None: ...
