"""Playing episodes (`episodes.play_episodes`) on a real env service with stand-in rollout replicas:
which sampling each episode of a group is played with, which turns the env could not read, and
which replica serves each episode."""

from __future__ import annotations

from services.common.conversation import expand_image_placeholders
from services.coordinator.grpo.episodes import PlayPlan, Policy, Prompting, Sampling, Timers, play_episodes
from services.coordinator.ops.replicas import Rollouts, Services
from services.coordinator.ops.wire import Generation, Prompt, TaskSpec
from tests.coordinator.chat import CHAT, CharTokenizer


class RecordingRollout:
    """A replica that answers every prompt of its t-th call with `answers[t]` (the last one after
    that; "right" by default) and records the prompts it was sent, call by call."""

    def __init__(self, answers: tuple[str, ...] = ("right",)) -> None:
        self.calls: list[list[Prompt]] = []
        self.answers = answers

    @property
    def prompts(self) -> list[Prompt]:
        return [p for call in self.calls for p in call]

    async def generate(self, prompts: list[Prompt]) -> list[Generation]:
        text = self.answers[min(len(self.calls), len(self.answers) - 1)]
        self.calls.append(list(prompts))
        tokens = [*CharTokenizer().encode(text), CHAT.im_end]
        return [Generation(prompt_token_ids=expand_image_placeholders(p.token_ids, CHAT.image_pad,
                                                                      [3] * len(p.images)),
                           token_ids=tokens, logprobs=[-0.1] * len(tokens), text=text,
                           adapter_version=p.adapter_version)
                for p in prompts]


PROMPTING = Prompting(CharTokenizer(), CHAT, "")


def _services(env_services: Services, *replicas: RecordingRollout) -> Services:
    return Services(env=env_services.env, rollouts=Rollouts(replicas), learner=None)  # type: ignore[arg-type]


async def test_the_first_episodes_of_each_group_are_played_greedily(env_services: Services) -> None:
    rollout = RecordingRollout()
    specs = [TaskSpec(seed=seed, max_moves=2) for seed in (11, 12)]
    episodes = await play_episodes(
        _services(env_services, rollout), PROMPTING, Policy("r", 0),
        PlayPlan(specs, samples_per_spec=4, sampling=Sampling(0.5, 0.75, 4), max_turns=2, seed=5, greedy_per_spec=1),
        Timers())
    assert [e.group_index for e in episodes] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(e.actions == ["right", "right"] for e in episodes)
    # Two turns of 8 episodes; in each turn, episodes 0 and 4 (the first of each group) are greedy.
    assert len(rollout.prompts) == 16
    for turn in range(2):
        asked = [(p.sampling.temperature, p.sampling.top_p) for p in rollout.calls[turn]]
        greedy, sampled = (0.0, 1.0), (0.5, 0.75)
        assert asked == [greedy, sampled, sampled, sampled] * 2, asked
    assert {p.sampling.max_tokens for p in rollout.prompts} == {4}


async def test_each_turn_records_whether_the_env_could_read_its_action(env_services: Services) -> None:
    rollout = RecordingRollout(answers=("downright", "right", "down"))
    episodes = await play_episodes(
        _services(env_services, rollout), PROMPTING, Policy("r", 0),
        PlayPlan([TaskSpec(seed=11, max_moves=3)], samples_per_spec=2, sampling=Sampling(1.0, 1.0, 4), max_turns=3,
                 seed=5), Timers())
    assert [e.actions for e in episodes] == [["downright", "right", "down"]] * 2
    assert [e.invalid_turns for e in episodes] == [[True, False, False]] * 2


async def test_every_turn_of_an_episode_goes_to_the_replica_of_its_first_turn(env_services: Services) -> None:
    # "stop" ends an episode at once; episodes that stop early shift the positions of the others in
    # the batch, which must not move them to another replica (its prefix cache holds their turns).
    first, second = RecordingRollout(("right", "stop", "down")), RecordingRollout(("left", "left", "stop"))
    services = _services(env_services, first, second)
    episodes = await play_episodes(
        services, PROMPTING, Policy("r", 0),
        PlayPlan([TaskSpec(seed=s, max_moves=5) for s in (11, 12, 13)], samples_per_spec=2,
                 sampling=Sampling(1.0, 1.0, 4), max_turns=5, seed=5), Timers())
    # Each replica's first call holds half the episodes; every later call holds only those.
    assert [len(call) for call in first.calls][0] == [len(call) for call in second.calls][0] == 3
    assert len(first.calls) == 2 and len(second.calls) == 3  # first's episodes stopped at their 2nd turn
    assert all(len(call) == 3 for call in second.calls)
    assert [e.actions for e in episodes[0::2]] == [["right", "stop"]] * 3
    assert [e.actions for e in episodes[1::2]] == [["left", "left", "stop"]] * 3
