"""An adapter published by the learner, loaded by the rollout service over gRPC (LoadAdapter,
real vLLM behind it): the service confirms the learner's manifest checksum, and the learner's
log-probs of the tokens it then generates in multi-turn image conversations match the service's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from mmrl.bench.synthetic import fake_generator, maze_frame, play_episodes, with_advantages
from mmrl_proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from services.common import storage
from services.common.conversation import ChatTokens, TokenConversation
from services.common.grpc_server import channel
from services.common.training import TOWER_LORA_TARGETS
from services.common.trajectory import Trajectory
from services.rollout.config import RolloutConfig
from services.rollout.engine_vllm import VllmEngine
from services.rollout.service import RolloutServer
from tests.learner.settings import train_json

pytest.importorskip("vllm")  # only vLLM may be missing: the project's own modules import above

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
TOLERANCE = 1e-4


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rollout(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Any, Path]]:
    shared = tmp_path_factory.mktemp("shared")
    config = RolloutConfig(
        model=str(tiny_model_dir),
        max_model_len=2048,
        limit_images_per_prompt=4,
        max_num_seqs=16,
        adapter_retention=2,
        max_loras=2,
        tower_lora=True,  # serves the language-model adapter of the first test as without it
    )
    server = await RolloutServer.start(
        config, "127.0.0.1:0", shared_root=shared, cache_dir=tmp_path_factory.mktemp("adapter-cache")
    )
    await server.start_engine(VllmEngine.start)
    async with channel(f"127.0.0.1:{server.port}") as ch:
        yield rollout_pb2_grpc.RolloutServiceStub(ch), shared
    await server.close()
    await server.running.stop(grace_s=0)


async def _play(
    stub: Any, tokenizer: Any, run_id: str, version: int, num_episodes: int, num_turns: int
) -> list[Trajectory]:
    """Multi-turn episodes through the rollout service, built the coordinator's way. A sample that
    contains a special token (a random model's babble, e.g. another <|image_pad|>) is drawn again."""
    chat = ChatTokens.from_tokenizer(tokenizer)
    special = set(tokenizer.all_special_ids) - {chat.im_end}
    conversations = [TokenConversation(chat) for _ in range(num_episodes)]
    for turn in range(num_turns):
        for index, conversation in enumerate(conversations):
            conversation.add_observation(
                tokenizer, f"Moves left: {num_turns - turn}.", [maze_frame(index, turn)]
            )
        for index, conversation in enumerate(conversations):
            for attempt in range(20):
                request = rollout_pb2.GenerationRequest(
                    prompt_token_ids=conversation.compact_ids,
                    images=[common_pb2.Image(data=f, mime_type="image/png") for f in conversation.images],
                    sampling=rollout_pb2.SamplingParams(
                        temperature=1.0, max_tokens=3, seed=1000 * index + attempt
                    ),
                    adapter_run_id=run_id if version else "",
                    adapter_version=version,
                )
                result = (await stub.Generate(rollout_pb2.GenerateRequest(requests=[request]))).results[0]
                assert result.adapter_version == version
                completion = result.completions[0]
                if not special & set(completion.token_ids):
                    break
            conversation.add_generation(
                list(result.prompt_token_ids), list(completion.token_ids), list(completion.logprobs)
            )
    return [
        Trajectory(
            trajectory_id=f"ep-{i}",
            token_ids=tuple(c.record_ids),
            loss_mask=tuple(c.loss_mask),
            logprobs=tuple(c.logprobs),
            advantages=tuple(c.loss_mask),
            images=tuple(c.images),
            turn_starts=tuple(c.turn_starts),
            adapter_version=version,
        )
        for i, c in enumerate(conversations)
    ]


def _trained_adapter(driver: Any, tokenizer: Any, run_id: str, **settings: Any) -> Any:
    """`run_id` configured on `driver` with `settings`, trained two steps on fake episodes and
    published as version 1."""
    driver.configure(run_id, train_json(learning_rate=0.05, micro_batch_size=4, **settings))
    warm_up = play_episodes(
        fake_generator(ChatTokens.from_tokenizer(tokenizer), tokenizer, 25),
        tokenizer,
        num_groups=1,
        group_size=4,
        num_turns=2,
    )
    for _ in range(2):
        driver.train_step(run_id, with_advantages(warm_up, [1.0, -1.0, 0.5, -0.25]))
    return driver.publish(run_id)


async def test_the_rollout_service_loads_a_learner_adapter_whose_samples_the_learner_scores_identically(
    rollout: tuple[Any, Path], tokenizer: Any, make_driver: Callable[..., Any]
) -> None:
    stub, shared = rollout
    driver = make_driver(shared)
    published = _trained_adapter(driver, tokenizer, "run")
    _, at_v1, _ = driver.save_checkpoint("run")

    loaded = await stub.LoadAdapter(
        rollout_pb2.LoadAdapterRequest(run_id="run", version=published.version, path=str(published.path))
    )
    assert (loaded.version, loaded.manifest_sha256) == (1, published.manifest_sha256)

    base = await _play(stub, tokenizer, "run", 0, num_episodes=3, num_turns=2)
    tuned = await _play(stub, tokenizer, "run", 1, num_episodes=3, num_turns=2)
    # The learner holds adapter v1: its log-probs (before the update) must match the v1 samples...
    on_tuned = driver.train_step("run", tuned).metrics
    assert on_tuned["train/logprob_abs_diff_vs_rollout_max"] <= TOLERANCE
    # ...and be far from the base samples' (so v1 differs from the base model, and the service
    # applied it): scored by the learner back at v1, as the step above moved it on.
    driver.load_checkpoint("run", str(at_v1))
    stale = driver.train_step("run", base).metrics
    assert stale["train/logprob_abs_diff_vs_rollout"] > 100 * TOLERANCE
    reference = make_driver(shared / "other")
    reference.configure("run", "{}")
    on_base = reference.train_step("run", base).metrics  # a zero adapter is the base model
    assert on_base["train/logprob_abs_diff_vs_rollout_max"] <= TOLERANCE
    print(
        "\nrollout service vs learner max |dlogp|: "
        f"adapter v1 {on_tuned['train/logprob_abs_diff_vs_rollout_max']:.2e}, "
        f"base {on_base['train/logprob_abs_diff_vs_rollout_max']:.2e}; adapter effect "
        f"{stale['train/logprob_abs_diff_vs_rollout']:.2e}"
    )


async def test_an_adapter_on_the_vision_tower_is_served_as_the_learner_trained_it(
    rollout: tuple[Any, Path], tokenizer: Any, make_driver: Callable[..., Any]
) -> None:
    from safetensors.torch import load_file

    stub, shared = rollout
    driver = make_driver(shared)
    published = _trained_adapter(driver, tokenizer, "tower", lora_target_modules=TOWER_LORA_TARGETS)
    weights = load_file(str(published.path / storage.ADAPTER_WEIGHTS))
    tower_b = [name for name in weights if "visual" in name and "lora_B" in name]
    assert tower_b and all(float(weights[name].abs().max()) > 1e-3 for name in tower_b)  # the tower was trained
    assert not [name for name in weights if "patch_embed" in name]
    await stub.LoadAdapter(
        rollout_pb2.LoadAdapterRequest(run_id="tower", version=published.version, path=str(published.path))
    )
    tuned = await _play(stub, tokenizer, "tower", 1, num_episodes=3, num_turns=2)
    on_tuned = driver.train_step("tower", tuned).metrics
    # An engine that left the tower's LoRA out would be off by far more (0.1 per token seen).
    assert on_tuned["train/logprob_abs_diff_vs_rollout_max"] <= TOLERANCE
