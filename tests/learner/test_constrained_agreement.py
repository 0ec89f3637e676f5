"""Constrained actions on the real engine: vLLM (CPU backend, float32, through the rollout's VllmEngine)
generates only the action words, and the learner's log-probs of what it generated, renormalised over
the same mask, agree with the engine's within 1e-5, before and after a trained adapter is loaded."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from mmrl.bench.synthetic import play_episodes, with_advantages
from services.common.constrained import ActionMask
from services.common.conversation import ChatTokens
from services.learner.batch import collate, prepare_batch
from services.learner.policy import token_logprobs
from tests.learner.settings import train_json

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
WORDS = ("left", "right", "forward")  # one-token words and a five-token one (the tiny tokenizer)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[tuple[Any, asyncio.AbstractEventLoop]]:
    from services.rollout.config import RolloutConfig
    from services.rollout.engine_vllm import VllmEngine

    loop = asyncio.new_event_loop()
    started = loop.run_until_complete(VllmEngine.start(RolloutConfig(
        model=str(tiny_model_dir), max_model_len=2048, limit_images_per_prompt=8, max_lora_rank=16)))
    yield started, loop
    loop.run_until_complete(started.shutdown())
    loop.close()


def _generator(engine: tuple[Any, asyncio.AbstractEventLoop], mask: ActionMask, end: int, adapter: Any = None,
               temperature: float = 1.0) -> Callable[..., Any]:
    from services.rollout.engine import EngineRequest, Sampling

    llm, loop = engine

    def generate(prompts: list[tuple[list[int], list[bytes]]]) -> list[tuple[list[int], list[int], list[float]]]:
        requests = [EngineRequest(compact, Sampling(temperature=temperature, max_tokens=mask.longest,
                                                    stop_token_ids=(end,), seed=i, allowed_sequences=mask.sequences),
                                  [Image.open(io.BytesIO(f)).convert("RGB") for f in frames], adapter)
                    for i, (compact, frames) in enumerate(prompts)]
        results = loop.run_until_complete(llm.generate(requests))
        return [(r.prompt_token_ids, r.completions[0].token_ids, r.completions[0].logprobs) for r in results]

    return generate


def _turn_texts(trajectories: list[Any], tokenizer: Any) -> list[str]:
    texts, current = [], []
    for trajectory in trajectories:
        for token, generated in zip(trajectory.token_ids, trajectory.loss_mask, strict=True):
            if generated:
                current.append(token)
            elif current:
                texts.append(tokenizer.decode(current, skip_special_tokens=True))
                current = []
    return texts


def test_the_learner_renormalises_over_the_engines_mask_and_agrees_with_it_within_1e_5(
    engine: tuple[Any, asyncio.AbstractEventLoop], tokenizer: Any, make_driver: Callable[..., Any]
) -> None:
    from services.rollout.engine import AdapterRef

    chat = ChatTokens.from_tokenizer(tokenizer)
    mask = ActionMask.from_words(tokenizer, WORDS, chat.im_end)
    assert max(len(s) for s in mask.sequences) == 6  # "forward" is five tokens here: a prefix mask
    base = play_episodes(_generator(engine, mask, chat.im_end), tokenizer, num_groups=2, group_size=4, num_turns=3)
    assert set(_turn_texts(base, tokenizer)) <= set(WORDS) and len(_turn_texts(base, tokenizer)) == 24

    driver = make_driver()
    driver.configure("run", train_json(learning_rate=0.05, micro_batch_size=4,
                                       action_sequences=[list(s) for s in mask.sequences]))
    first = driver.train_step("run", with_advantages(base, [1.0, -1.0, 0.5, -0.5, 0.25, -0.25, 1.0, -1.0])).metrics
    driver.train_step("run", with_advantages(base, [1.0, -1.0, 0.5, -0.5, 0.25, -0.25, 1.0, -1.0]))
    published = driver.publish("run")
    llm, loop = engine
    adapter = AdapterRef(name="run-v1", lora_int_id=1, path=str(published.path), version=1)
    loop.run_until_complete(llm.add_adapter(adapter))
    tuned = play_episodes(_generator(engine, mask, chat.im_end, adapter), tokenizer, num_groups=2, group_size=4,
                          num_turns=3, seed=1)
    second = driver.train_step("run", tuned).metrics  # log-probs measured before this step's update

    # Without the renormalisation the same tokens score far from the engine's: the mask is what agrees.
    spec, frames = driver.engine.spec, driver.engine.frames
    free = collate(prepare_batch(base, spec, frames), spec.pad_token_id, spec.image_token_id)
    with torch.no_grad(), driver.engine.run.model.disable_adapter():
        unmasked, _ = token_logprobs(driver.engine.run.model, free, "cpu")
    free_gap = (unmasked - free.rollout_logprobs)[free.loss_mask.bool()].abs().max().item()
    print(f"\nconstrained learner vs vLLM max |dlogp|: base {first['train/logprob_abs_diff_vs_rollout_max']:.2e}, "
          f"adapter v1 {second['train/logprob_abs_diff_vs_rollout_max']:.2e}; unmasked {free_gap:.2e}")
    assert first["train/logprob_abs_diff_vs_rollout_max"] <= TOLERANCE
    assert second["train/logprob_abs_diff_vs_rollout_max"] <= TOLERANCE
    assert free_gap > 1.0


def test_greedy_decoding_under_the_mask_answers_a_word(engine: tuple[Any, asyncio.AbstractEventLoop],
                                                       tokenizer: Any) -> None:
    chat = ChatTokens.from_tokenizer(tokenizer)
    mask = ActionMask.from_words(tokenizer, WORDS, chat.im_end)
    greedy = play_episodes(_generator(engine, mask, chat.im_end, temperature=0.0), tokenizer, num_groups=1,
                           group_size=2, num_turns=2)
    assert set(_turn_texts(greedy, tokenizer)) <= set(WORDS)
