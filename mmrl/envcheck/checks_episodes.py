"""Checks of episodes: observations, determinism, bad actions, the turn limit, the optional
capabilities and many episodes at once. Each takes the Context and returns a one-line detail, or
raises CheckFailed; the runner closes every episode a check created."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from mmrl.envcheck.probe import CheckFailed, Context, image_pixels, observation_of
from mmrl_proto.v1 import env_pb2

MAX_TURNS = 32  # turns played per episode at most
TURN_LIMIT = 3  # move budget of the turn-limit check
LONG_ACTION_CHARS = 2048
NUM_CONCURRENT_CLIENTS, EPISODES_PER_CLIENT, CONCURRENT_TURNS = 8, 8, 3


def _budgeted(spec: env_pb2.EpisodeSpec, max_moves: int) -> env_pb2.EpisodeSpec:
    return env_pb2.EpisodeSpec(seed=spec.seed, max_moves=max_moves, options=spec.options)


async def observations(ctx: Context) -> str:
    """Every image of a played episode decodes in the format its mime_type names."""
    history = (await ctx.play(await ctx.probe.create([await ctx.task()]), MAX_TURNS))[0]
    per_turn: Counter[int] = Counter()
    sizes: Counter[str] = Counter()
    for turn, state in enumerate(history):
        per_turn[len(state.observation.images)] += 1
        for k, image in enumerate(state.observation.images):
            (width, height), _ = image_pixels(image, f"turn {turn} image {k}")
            sizes[f"{width}x{height}"] += 1
    counts = ", ".join(f"{n} image{'s' * (n != 1)}: {c}" for n, c in sorted(per_turn.items()))
    return f"{len(history)} observations ({counts}); sizes {', '.join(sorted(sizes)) or 'none'}"


async def determinism(ctx: Context) -> str:
    """Episodes of the same task (a training task and the default eval set's first), created together
    or apart, show the same observations (pixels, text) and rewards for the same actions."""
    train, evaluated = await ctx.task(), (await ctx.probe.eval_set("")).specs[0]
    together = await ctx.probe.create([train, train, evaluated, evaluated])
    apart = await ctx.probe.create([train])
    histories = await ctx.play(together + apart, MAX_TURNS, same_actions_as=[0, 0, 2, 2, 0])
    for label, (a, b) in {"training task, created together": (0, 1), "eval task, created together": (2, 3),
                          "training task, created apart": (0, 4)}.items():
        left, right = histories[a], histories[b]
        for turn in range(max(len(left), len(right))):
            if turn >= len(left) or turn >= len(right):
                raise CheckFailed(f"{label}: one episode ended after {min(len(left), len(right)) - 1} turns, "
                                  f"the other did not")
            if observation_of(left[turn]) != observation_of(right[turn]):
                field = _first_difference(left[turn], right[turn])
                raise CheckFailed(f"{label}: the same actions gave another {field} at turn {turn}")
    turns = [len(h) - 1 for h in histories]
    return f"3 pairs of episodes alike over {min(turns)}-{max(turns)} turns"


def _first_difference(a: env_pb2.EpisodeState, b: env_pb2.EpisodeState) -> str:
    for field, get in (("text", lambda s: s.observation.text), ("reward", lambda s: s.reward),
                       ("done", lambda s: (s.done, s.truncated)), ("state_key", lambda s: s.state_key)):
        if get(a) != get(b):
            return field
    return "image"


async def bad_actions(ctx: Context) -> str:
    """Empty, random, control-character and long action texts are answered (an invalid move, not an
    error) and the episodes go on."""
    rng = random.Random(0)
    noise = "".join(rng.choice("abcxyz0123 !?.,;:<>/\\\"'\té漢🙂") for _ in range(200))
    texts = ["", noise, "\x00\x01<|im_end|>\n\r</answer>", "x" * LONG_ACTION_CHARS]
    states = await ctx.probe.create([await ctx.task()] * len(texts))
    stepped = await ctx.probe.step([(s.episode_id, t) for s, t in zip(states, texts, strict=True)])
    invalid = sum(bool(s.info.fields["invalid"].bool_value) for s in stepped if "invalid" in s.info.fields)
    live = [s for s in stepped if not s.done]
    if live:
        info = await ctx.info()
        await ctx.probe.step([(s.episode_id, info.actions[0]) for s in live])
    return (f"{len(texts)} bad actions (empty, random, control characters, {LONG_ACTION_CHARS} characters) "
            f"answered, {invalid} marked info.invalid; {len(live)} episodes then took a valid action")


async def turn_limit(ctx: Context) -> str:
    """An episode with max_moves=3 playing the first action word is done within 3 moves, not truncated
    when it ends before its budget. Ending on the third move it is truncated unless its task ended by
    itself then, which an episode of the same task with 2 moves more shows: done on the same move with
    the same actions (terminated, not truncated, when both happen; docs/environments.md)."""
    info = await ctx.info()
    budgeted, roomy = await ctx.probe.create([_budgeted(await ctx.task(), TURN_LIMIT),
                                              _budgeted(await ctx.task(), TURN_LIMIT + 2)])
    for move in range(1, TURN_LIMIT + 1):
        budgeted, roomy = await ctx.probe.step([(budgeted.episode_id, info.actions[0]),
                                                (roomy.episode_id, info.actions[0])])
        if budgeted.done:
            if move < TURN_LIMIT and budgeted.truncated:
                raise CheckFailed(f"truncated after {move} of {TURN_LIMIT} moves")
            if move == TURN_LIMIT and budgeted.truncated == (roomy.done and not roomy.truncated):
                raise CheckFailed(
                    f"done after the {TURN_LIMIT}-move budget was spent, "
                    + ("truncated, but the task ended by itself then (with 2 moves more it is done on the same "
                       "move): report it terminated" if budgeted.truncated else
                       "but not truncated, while with 2 moves more the episode goes on"))
            return (f"max_moves {TURN_LIMIT}: done after {move} moves "
                    f"({'truncated' if budgeted.truncated else 'terminated'})")
    raise CheckFailed(f"not done after {TURN_LIMIT} moves with max_moves {TURN_LIMIT}")


async def state_keys(ctx: Context) -> str:
    """With capability state_keys: every state has a key, equal for two episodes of the same task
    given the same actions."""
    if "state_keys" not in (await ctx.info()).capabilities:
        return "skipped: capability state_keys not declared"
    task = await ctx.task()
    histories = await ctx.play(await ctx.probe.create([task, task]), MAX_TURNS, same_actions_as=[0, 0])
    for turn, (a, b) in enumerate(zip(*histories, strict=False)):
        if not a.state_key or not b.state_key:
            raise CheckFailed(f"turn {turn}: a state without a state_key")
        if a.state_key != b.state_key:
            raise CheckFailed(f"turn {turn}: equal states with keys {a.state_key!r} and {b.state_key!r}")
    distinct = len({s.state_key for s in histories[0]})
    return f"{len(histories[0])} states keyed ({distinct} distinct), equal across the two episodes"


async def oracle(ctx: Context) -> str:
    """With capability oracle: every state not done names info.optimal_action, one of the actions."""
    info = await ctx.info()
    if "oracle" not in info.capabilities:
        return "skipped: capability oracle not declared"
    actions = {a.lower() for a in info.actions}
    history = (await ctx.play(await ctx.probe.create([await ctx.task()]), MAX_TURNS))[0]
    for turn, state in enumerate(history):
        if state.done:
            continue
        value = state.info.fields.get("optimal_action")
        if value is None or value.string_value.lower() not in actions:
            shown = "missing" if value is None else repr(value.string_value)
            raise CheckFailed(f"turn {turn}: info.optimal_action {shown}, not one of {sorted(actions)}")
    final = history[-1]
    outcome = "done" if final.done else f"not done after {MAX_TURNS} turns"
    solved = final.info.fields["solved"].bool_value if "solved" in final.info.fields else None
    return (f"followed for {len(history) - 1} turns: {outcome}, return {sum(s.reward for s in history):g}"
            + ("" if solved is None else f", solved {str(solved).lower()}"))


async def concurrency(ctx: Context) -> str:
    """8 clients at once, each creating 8 episodes and stepping them 3 turns: every call is
    answered with its own episodes."""
    task = await ctx.task()

    async def client() -> int:
        states = await ctx.probe.create([task] * EPISODES_PER_CLIENT)
        histories = await ctx.play(states, CONCURRENT_TURNS)
        await ctx.probe.close([s.episode_id for s in states])
        return sum(len(h) - 1 for h in histories)

    # every client runs to its end before the check answers, so a failing one leaves no call in flight
    # to land in the next check
    answers = await asyncio.gather(*(client() for _ in range(NUM_CONCURRENT_CLIENTS)), return_exceptions=True)
    failed = [a for a in answers if isinstance(a, BaseException)]
    if failed:
        raise failed[0]
    steps = [a for a in answers if isinstance(a, int)]
    return (f"{NUM_CONCURRENT_CLIENTS} clients x {EPISODES_PER_CLIENT} episodes, {sum(steps)} episode steps, "
            "every answer its own")
