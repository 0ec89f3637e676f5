"""What a run needs from its environment, checked at start, and the seeds of each step's tasks.

The environment draws the training tasks itself (GetTrainingTasks) from a seed string that is a
pure function of (run seed, step, sampling round), so a replayed step plays the same tasks; it
never draws a task of its eval sets."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.constrained import ActionMask
from services.common.conversation import ChatTokens, Tokenizer
from services.coordinator.config import RunConfig
from services.coordinator.grpo.credit import VARIANTS
from services.coordinator.ops.wire import EnvInfo

MAX_MASK_TOKENS = 128  # vLLM scores at most this many given tokens per position (logprob_token_ids)


class ConfigRefused(ValueError):
    """The run config cannot run on these services (e.g. colocated mode without sleep support)."""


def task_seed(run_seed: int, step: int, round_index: int) -> str:
    """The seed the env draws one sampling round's training tasks from."""
    return f"mmrl:{run_seed}:{step}:{round_index}"


def action_tokens(tokenizer: Tokenizer, word: str) -> int:
    """The tokens an action word takes in the model's answer."""
    return len(tokenizer.encode(word, add_special_tokens=False))


def action_token_budget(tokenizer: Tokenizer, actions: Sequence[str]) -> int:
    """The tokens of the env's longest action word: an answer stops there, as in a run whose
    `sampling.max_tokens` holds one word and no more (configs/maze-tiny-cpu.yaml: 1). A larger budget
    lets an adapter trained that way write past its word, where its training never looked."""
    return max((action_tokens(tokenizer, word) for word in actions), default=1)


def require_action_budget(tokenizer: Tokenizer, max_tokens: int, actions: Sequence[str]) -> None:
    """Refuses a token budget too small for one of the env's action words, which would cut every
    such action to an invalid one: `sampling.max_tokens: 1` is right only where every word is one token."""
    for word in actions:
        length = action_tokens(tokenizer, word)
        if length > max_tokens:
            raise ConfigRefused(f"sampling.max_tokens {max_tokens} cannot hold the action {word!r}, "
                                f"{length} tokens with this model's tokenizer")


def action_sequences(config: RunConfig, tokenizer: Tokenizer, chat: ChatTokens,
                     actions: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """The constrained actions' mask of the env's action words (`sampling.actions: constrained`), () for free text;
    refused when two words share their tokens or the mask needs more tokens than the engine scores."""
    if config.sampling.actions == "free":
        return ()
    try:
        mask = ActionMask.from_words(tokenizer, actions, chat.im_end)
    except ValueError as exc:
        raise ConfigRefused(f"sampling.actions constrained: {exc}") from None
    if len(mask.tokens) > MAX_MASK_TOKENS:
        raise ConfigRefused(f"sampling.actions constrained: the action words take {len(mask.tokens)} distinct "
                            f"tokens, more than the {MAX_MASK_TOKENS} the rollout engine scores")
    return mask.sequences


def require_env(config: RunConfig, env: EnvInfo) -> None:
    """Refuses a run on an environment other than the one it names, or one that lacks a capability
    the run's settings need, naming it."""
    if config.env.name and config.env.name != env.name:
        raise ConfigRefused(f"the run expects env {config.env.name!r}; the env service is {env.name!r}")
    for capability in VARIANTS[config.grpo.credit].needs:
        if capability not in env.capabilities:
            raise ConfigRefused(f"grpo.credit {config.grpo.credit!r} needs the env capability {capability!r}, "
                                f"which env {env.name!r} does not declare (it has: "
                                f"{', '.join(env.capabilities) or 'none'})")
    if config.eval.eval_set and config.eval.eval_set not in env.eval_sets:
        raise ConfigRefused(f"eval.eval_set {config.eval.eval_set!r} is not one of env {env.name!r}'s eval sets "
                            f"({', '.join(env.eval_sets) or 'none'})")
