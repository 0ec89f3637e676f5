"""Constrained actions inside the vLLM engine (services/common/constrained.py defines the mask).

`ActionMaskLogitsProcessor` is registered with every engine (`logits_processors`) and acts only on
requests whose `extra_args` carry allowed sequences: before each sampled token it keeps the logits of
the tokens the mask allows after the tokens generated so far and sets the others to -inf (greedy
decoding included: it is not argmax-invariant). The engine reports the raw log-probs of every token of
the mask (`logprob_token_ids`); `renormalised_logprobs` turns them into the masked distribution's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from services.common.constrained import ActionMask

EXTRA_ARG = "mmrl_allowed_sequences"
PROCESSOR = "services.rollout.constrained:ActionMaskLogitsProcessor"


class ActionMaskLogitsProcessor(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        sequences = (params.extra_args or {}).get(EXTRA_ARG)
        if not sequences:
            return None
        mask = ActionMask(tuple(tuple(s) for s in sequences))

        def keep_allowed(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            allowed = mask.allowed(output_ids)
            assert allowed, f"generation went past the action mask: {list(output_ids)}"
            index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
            masked = torch.full_like(logits, float("-inf"))
            masked[index] = logits[index]
            return masked

        return keep_allowed


def renormalised_logprobs(mask: ActionMask, token_ids: Sequence[int],
                          positions: Sequence[Mapping[int, Any]]) -> list[float]:
    """log pi_A of each generated token from the engine's raw log-probs of the mask's tokens."""
    return [mask.renormalised(token_ids[:i], token, {t: float(lp.logprob) for t, lp in position.items()})
            for i, (token, position) in enumerate(zip(token_ids, positions, strict=True))]
