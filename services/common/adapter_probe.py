"""The adapter probe: proof that a rollout replica applies the LoRA adapter it loaded.

When the learner publishes an adapter version it scores a fixed text (`PROBE_TEXT`, tokenized by
the model's tokenizer) twice, with the adapter and with it disabled, and writes both lists of
per-token log-probs into the version's manifest (`Probe`, key `probe`). After every LoadAdapter a
rollout replica scores the same token ids under the version it just loaded and under its base
model, and `check` decides:

- the served log-probs must match the learner's within the tolerance (mean absolute difference
  per token), else the replica serves something other than what was trained;
- where the learner's adapter moves the probe by more than twice the tolerance, the served
  adapter must move it by more than the tolerance: an engine that silently ignores the adapter
  answers with the base model's log-probs.

A version whose adapter hardly moves the probe (the first steps of a run) passes on the first check
alone: the probe cannot tell it from the base model there, and `ProbeResult.distinguishable` says
so. The check costs one forward of a few dozen tokens per adapter load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.common import storage

PROBE_TEXT = ("Adapter probe. The image shows the agent's surroundings. Reply with one move: up, down, "
              "left or right. left right up down left")


class _Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def probe_token_ids(tokenizer: _Encoder) -> list[int]:
    """The probe's token ids under the model's tokenizer."""
    ids = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
    if len(ids) < 2:
        raise ValueError("the tokenizer encodes the probe text to fewer than 2 tokens")
    return ids


@dataclass(frozen=True)
class Probe:
    """What the learner measured: `logprobs[i]` is the log-prob of `token_ids[i + 1]` given the
    tokens before it, with the adapter; `base_logprobs` the same with the adapter disabled."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    base_logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.token_ids) - 1
        if n < 1 or len(self.logprobs) != n or len(self.base_logprobs) != n:
            raise ValueError(f"a probe needs at least 2 token ids and one log-prob per token after the first "
                             f"({len(self.token_ids)} ids, {len(self.logprobs)} and {len(self.base_logprobs)} "
                             "log-probs)")
        if not all(math.isfinite(v) for v in (*self.logprobs, *self.base_logprobs)):
            raise ValueError("probe log-probs must be finite")

    def to_manifest(self) -> dict[str, Any]:
        return {storage.PROBE_KEY: {"token_ids": list(self.token_ids), "logprobs": list(self.logprobs),
                               "base_logprobs": list(self.base_logprobs)}}

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> Probe | None:
        """The probe a manifest carries; None if it has none; ValueError if it is malformed."""
        entry = manifest.get(storage.PROBE_KEY)
        if entry is None:
            return None
        try:
            return cls(tuple(int(t) for t in entry["token_ids"]), tuple(float(v) for v in entry["logprobs"]),
                       tuple(float(v) for v in entry["base_logprobs"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed adapter probe in the manifest: {exc}") from exc


def model_logprobs(model: Any, token_ids: Sequence[int], device: Any = "cpu") -> list[float]:
    """Log-prob of each of `token_ids[1:]` given the tokens before it, from a Hugging Face causal or
    image-text model's forward (text only, no cache), computed in float32 from its logits."""
    import torch

    input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
    with torch.no_grad():
        logits = model(input_ids=input_ids, mm_token_type_ids=torch.zeros_like(input_ids), use_cache=False).logits
    log_probs = torch.log_softmax(logits[0, :-1].float(), dim=-1)
    return log_probs.gather(-1, input_ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()


def measure(peft_model: Any, token_ids: Sequence[int], device: Any = "cpu") -> Probe:
    """The probe of a peft model's adapter: `model_logprobs` with the adapter, then with it disabled."""
    logprobs = model_logprobs(peft_model, token_ids, device)
    with peft_model.disable_adapter():
        base = model_logprobs(peft_model, token_ids, device)
    return Probe(tuple(token_ids), tuple(logprobs), tuple(base))


def mean_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    assert len(a) == len(b) and a, "log-prob lists of the same, non-zero length"
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


@dataclass(frozen=True)
class ProbeResult:
    gap: float
    """Mean |served - learner| per token, with the adapter."""
    learner_effect: float
    """Mean |adapter - base| per token, as the learner computed them."""
    served_effect: float
    """Mean |adapter - base| per token, as the replica serves them."""
    tolerance: float

    @property
    def distinguishable(self) -> bool:
        """Whether the learner's adapter moves the probe far enough to tell it from the base model."""
        return self.learner_effect > 2 * self.tolerance

    def problem(self) -> str | None:
        """Why the replica does not serve the adapter the learner published, or None when it does."""
        if not self.gap <= self.tolerance:  # also NaN
            return (f"its probe log-probs differ from the learner's by {self.gap:.3g} per token on average "
                    f"(tolerance {self.tolerance:g})")
        if self.distinguishable and not self.served_effect > self.tolerance:
            return (f"it answers like the base model (adapter moves the probe by {self.served_effect:.3g} per "
                    f"token, the learner's by {self.learner_effect:.3g}): the adapter is not applied")
        return None


def check(probe: Probe, served: Sequence[float], served_base: Sequence[float], tolerance: float) -> ProbeResult:
    """Compares what a replica serves with what the learner published."""
    if len(served) != len(probe.logprobs) or len(served_base) != len(probe.logprobs):
        raise ValueError(f"the replica scored {len(served)} and {len(served_base)} tokens, the probe has "
                         f"{len(probe.logprobs)}")
    return ProbeResult(gap=mean_abs_diff(served, probe.logprobs),
                       learner_effect=mean_abs_diff(probe.logprobs, probe.base_logprobs),
                       served_effect=mean_abs_diff(served, served_base), tolerance=tolerance)
