"""Playing episodes (`episodes.play_episodes`) on a real env service with a stand-in rollout engine:
which sampling each episode of a group is played with, and which turns the env could not read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from mmrl.v1 import env_pb2, rollout_pb2
from services.common.conversation import expand_image_placeholders
from services.coordinator.clients import Services
from services.coordinator.episodes import Sampling, Timers, play_episodes
from tests.coordinator.chat import CHAT, CharTokenizer


class RecordingRollout:
    """Answers every request of turn t with `answers[t]` (the last one after that; "right" by
    default) and records the sampling each request asked for."""

    def __init__(self, answers: tuple[str, ...] = ("right",)) -> None:
        self.requests: list[rollout_pb2.GenerationRequest] = []
        self.stub = SimpleNamespace(Generate=self._generate)
        self.answers, self.turn = answers, 0

    async def call(self, _method: str, rpc: Any, request: Any, timeout_s: float | None = None) -> Any:
        return await rpc(request)

    async def _generate(self, request: rollout_pb2.GenerateRequest) -> rollout_pb2.GenerateResponse:
        self.requests += request.requests
        text = self.answers[min(self.turn, len(self.answers) - 1)]
        self.turn += 1
        tokens = [*CharTokenizer().encode(text), CHAT.im_end]
        return rollout_pb2.GenerateResponse(results=[
            rollout_pb2.GenerationResult(
                prompt_token_ids=expand_image_placeholders(list(r.prompt_token_ids), CHAT.image_pad,
                                                           [3] * len(r.images)),
                adapter_version=r.adapter_version,
                completions=[rollout_pb2.Completion(token_ids=tokens, logprobs=[-0.1] * len(tokens), text=text)],
            )
            for r in request.requests
        ])


async def test_the_first_episodes_of_each_group_are_played_greedily(env_services: Services) -> None:
    rollout = RecordingRollout()
    services = Services(env=env_services.env, rollouts=[rollout], learner=None)  # type: ignore[list-item, arg-type]
    specs = [env_pb2.EpisodeSpec(seed=seed, max_moves=2) for seed in (11, 12)]
    episodes = await play_episodes(
        services, CharTokenizer(), CHAT, specs, samples_per_spec=4, sampling=Sampling(0.5, 0.75, 4),
        run_id="r", adapter_version=0, system_prompt="", max_turns=2, seed=5, timers=Timers(),
        greedy_per_spec=1,
    )
    assert [e.group_index for e in episodes] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(e.actions == ["right", "right"] for e in episodes)
    # Two turns of 8 episodes; in each turn, episodes 0 and 4 (the first of each group) are greedy.
    assert len(rollout.requests) == 16
    for turn in range(2):
        asked = [(r.sampling.temperature, r.sampling.top_p) for r in rollout.requests[turn * 8:(turn + 1) * 8]]
        greedy, sampled = (0.0, 1.0), (0.5, 0.75)
        assert asked == [greedy, sampled, sampled, sampled] * 2, asked
    assert {r.sampling.max_tokens for r in rollout.requests} == {4}


async def test_each_turn_records_whether_the_env_could_read_its_action(env_services: Services) -> None:
    rollout = RecordingRollout(answers=("downright", "right", "down"))
    services = Services(env=env_services.env, rollouts=[rollout], learner=None)  # type: ignore[list-item, arg-type]
    episodes = await play_episodes(
        services, CharTokenizer(), CHAT, [env_pb2.EpisodeSpec(seed=11, max_moves=3)], samples_per_spec=2,
        sampling=Sampling(1.0, 1.0, 4), run_id="r", adapter_version=0, system_prompt="", max_turns=3, seed=5,
        timers=Timers(),
    )
    assert [e.actions for e in episodes] == [["downright", "right", "down"]] * 2
    assert [e.invalid_turns for e in episodes] == [[True, False, False]] * 2
