"""SFT: expert data through a real env service, and the seed ranges it may use."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from pydantic import ValidationError

from services.learner.sft import SftConfig, train_sft

T = TypeVar("T")


def _with_env_service(work: Callable[[str], T]) -> T:
    """Runs `work(address)` in a thread while a real env gRPC service listens on loopback."""
    from mmrl.v1 import env_pb2_grpc
    from services.common.grpc_server import start_server
    from services.env.config import EnvConfig
    from services.env.environment import MazeEnv
    from services.env.servicer import SERVICE_NAME, EnvServicer

    async def serve() -> T:
        servicer = EnvServicer(MazeEnv(EnvConfig()))
        running = await start_server(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s),
                                     SERVICE_NAME, "127.0.0.1:0")
        try:
            return await asyncio.to_thread(work, f"127.0.0.1:{running.port}")
        finally:
            await running.stop()

    return asyncio.run(serve())


def test_sft_data_can_never_reach_the_eval_seed_range() -> None:
    """The config is refused unless the mazes it will play, which skip the layouts reserved for
    eval sets, all lie below the eval seed range."""
    from services.common.maze import TRAIN_SEED_LIMIT, is_training_seed

    first = TRAIN_SEED_LIMIT - 1000
    fits = sum(is_training_seed(s, 9) for s in range(first, TRAIN_SEED_LIMIT))
    assert 0 < fits < 1000  # some of the last 1,000 seeds carve reserved layouts
    config = SftConfig(base_model="m", out="o", first_seed=first, num_mazes=fits)
    seeds = config.maze_seeds()
    assert len(seeds) == fits and max(seeds) < TRAIN_SEED_LIMIT
    for count in (fits + 1, 1000):  # one seed too many; and as many mazes as seeds left
        with pytest.raises(ValidationError, match="reach the eval seed range"):
            SftConfig(base_model="m", out="o", first_seed=first, num_mazes=count)
    with pytest.raises(ValidationError, match="must be odd"):
        SftConfig(base_model="m", out="o", size=8)


def test_sft_mazes_skip_the_layouts_reserved_for_eval_sets(tiny_model_dir: Path) -> None:
    """The SFT's data are never an eval maze, by seed or by layout: its first 2,000 seeds from
    500,000 would carve 29 of the default eval set's 64 layouts."""
    from transformers import AutoTokenizer

    from services.common.maze import is_eval_layout, layout_key
    from services.env.evalset import get_eval_set
    from services.learner.sft import expert_conversations

    eval_layouts = {layout_key(spec.seed, 9) for spec in get_eval_set().specs}
    default = SftConfig(base_model="m", out="o")
    by_seed = range(default.first_seed, default.first_seed + default.num_mazes)
    assert len(eval_layouts & {layout_key(s, 9) for s in by_seed}) > 20  # 29 of 64: what skipping prevents
    seeds = default.maze_seeds()
    assert len(seeds) == len(set(seeds)) == default.num_mazes and seeds[0] >= default.first_seed
    assert not eval_layouts & {layout_key(s, 9) for s in seeds}
    assert not any(is_eval_layout(layout_key(s, 9)) for s in seeds)
    # The conversations the SFT trains on are played on exactly those mazes.
    config = SftConfig(base_model="m", out="o", num_mazes=40)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    played = _with_env_service(lambda address: expert_conversations(address, config, tokenizer, lambda _f: 25))
    assert sorted(int(t.trajectory_id.removeprefix("sft-")) for t in played) == config.maze_seeds()
    assert config.maze_seeds() != list(range(config.first_seed, config.first_seed + 40))


def test_a_short_sft_learns_the_expert_moves_and_saves_a_loadable_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    config = SftConfig(base_model=str(tiny_model_dir), out=str(tmp_path / "sft"), num_mazes=8,
                       updates=8, batch_size=4, micro_batch_size=4, warmup_steps=0, learning_rate=3e-3)
    report = _with_env_service(lambda address: train_sft(config, address, lambda _m: None))
    losses = [h["loss"] for h in report["loss_history"]]
    assert report["num_conversations"] == 8  # every expert episode reaches the goal
    assert losses[-1] < 0.5 * losses[0]
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "sft")
    assert model.config.image_token_id
    assert (tmp_path / "sft" / "sft_report.json").is_file() and (tmp_path / "sft" / "tokenizer.json").is_file()


def _untrained_runs(config: SftConfig, tokenizer_dir: Path) -> tuple[list[int], list[tuple[int, ...]]]:
    """Expert data from a real env service: lengths of the runs of consecutive untrained (detour)
    turns, and every conversation's token ids."""
    from transformers import AutoTokenizer

    from services.learner.sft import expert_conversations

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    runs = []
    trajectories = _with_env_service(
        lambda address: expert_conversations(address, config, tokenizer, lambda _frame: 25))
    for traj in trajectories:
        bounds = [*traj.turn_starts, len(traj.token_ids)]
        trained = [any(traj.loss_mask[a:b]) for a, b in itertools.pairwise(bounds)]
        run = 0
        for flag in [*trained, True]:
            if not flag:
                run += 1
            elif run:
                runs.append(run)
                run = 0
    return runs, [t.token_ids for t in trajectories]


def test_detours_of_several_moves_lead_the_expert_data_off_the_path(tiny_model_dir: Path) -> None:
    common = {"base_model": "m", "out": "o", "num_mazes": 48, "perturb_prob": 0.1}
    single, single_ids = _untrained_runs(SftConfig(**common), tiny_model_dir)
    _, explicit_ids = _untrained_runs(SftConfig(**common, detour_moves=1), tiny_model_dir)
    longer, _ = _untrained_runs(SftConfig(**common, detour_moves=4), tiny_model_dir)
    assert explicit_ids == single_ids  # the default plays exactly the data it played before the setting existed
    assert SftConfig(**common).fingerprint() == SftConfig(**common, detour_moves=1).fingerprint()
    assert SftConfig(**common).fingerprint() != SftConfig(**common, detour_moves=4).fingerprint()
    assert single and longer
    assert max(longer) >= 3 and sum(longer) / len(longer) > 1.5 > sum(single) / len(single)


def test_frame_reading_answers_with_the_moves_the_env_service_lets_through(tiny_model_dir: Path) -> None:
    """Each question's answer is checked against the env service itself: from the question's cell,
    exactly the moves the answer leaves out hit a wall."""
    import random

    import grpc
    from transformers import AutoTokenizer

    from mmrl.v1 import env_pb2, env_pb2_grpc
    from services.learner.sft import READING_QUESTION, frame_reading_questions

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = SftConfig(base_model="m", out="o", num_mazes=5, first_seed=700_000)
    moves = ("up", "down", "left", "right")

    def ask_and_check(address: str) -> list[tuple[int, int, int]]:
        with grpc.insecure_channel(address) as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            questions = frame_reading_questions(stub, config, tokenizer, lambda _frame: 25, random.Random(3), 40)
            asked = []
            for question in questions:
                assert READING_QUESTION in tokenizer.decode(question.token_ids) and len(question.images) == 1
                _, seed, row, col = question.trajectory_id.split("-")
                answer = tokenizer.decode([t for t, m in zip(question.token_ids, question.loss_mask, strict=True)
                                           if m], skip_special_tokens=True).split()
                spec = env_pb2.EpisodeSpec(seed=int(seed), max_moves=20,
                                           options={"size": "9", "start": f"{row},{col}"})
                created = stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=[spec] * 4))
                assert created.episodes[0].observation.images[0].data == question.images[0]
                stepped = stub.Step(env_pb2.StepRequest(actions=[
                    env_pb2.EpisodeAction(episode_id=e.episode_id, action=move)
                    for e, move in zip(created.episodes, moves, strict=True)]))
                bumped = {move for move, e in zip(moves, stepped.episodes, strict=True) if e.info["wall_bump"]}
                assert answer and set(answer) == set(moves) - bumped, (question.trajectory_id, answer, bumped)
                assert answer == [m for m in moves if m in answer]  # always in the same order
                asked.append((int(seed), int(row), int(col)))
            return asked

    asked = _with_env_service(ask_and_check)
    assert len(asked) == 40 and len(set(asked)) > 20
    assert all(seed in config.maze_seeds() and (row, col) != (3, 3) for seed, row, col in asked)  # never on the goal


def test_frame_reading_runs_before_the_expert_updates_and_counts_in_the_fingerprint(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    common = {"base_model": str(tiny_model_dir), "out": str(tmp_path / "sft"), "num_mazes": 4, "updates": 2,
              "batch_size": 4, "micro_batch_size": 4, "warmup_steps": 0, "learning_rate": 3e-3}
    assert SftConfig(**common).fingerprint() == SftConfig(**common, reading_batch_size=64).fingerprint()
    assert SftConfig(**common).fingerprint() != SftConfig(**common, reading_updates=10).fingerprint()
    config = SftConfig(**common, reading_updates=10, reading_batch_size=16)
    report = _with_env_service(lambda address: train_sft(config, address, lambda _m: None))
    reading = [h["loss"] for h in report["reading_loss_history"]]
    assert report["reading_updates"] == 10 and len(reading) == 10 and len(report["loss_history"]) == 2
    assert reading[-1] < 0.5 * reading[0]


def test_saving_over_a_model_swaps_it_in_and_a_failed_save_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.learner.sft import _save

    class Saves:
        def __init__(self, text: str) -> None:
            self.text = text

        def save_pretrained(self, directory: Path, **kwargs: object) -> None:
            if self.text == "broken":
                raise OSError("disk full")
            Path(directory).mkdir(parents=True, exist_ok=True)
            (Path(directory) / "weights").write_text(self.text)

    out = tmp_path / "sft"
    _save(Saves("first"), Saves("first"), out, {"updates": 1})
    _save(Saves("second"), Saves("second"), out, {"updates": 2})
    assert (out / "weights").read_text() == "second"
    with pytest.raises(OSError):
        _save(Saves("broken"), Saves("broken"), out, {"updates": 3})
    assert (out / "weights").read_text() == "second"

    # The swap itself fails (the new model cannot be renamed into place): the old one is put back.
    rename = Path.rename

    def refuse_the_new_model(self: Path, target: Path) -> Path:
        if self.name == ".tmp-sft":
            raise OSError("rename refused")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse_the_new_model)
    with pytest.raises(OSError, match="rename refused"):
        _save(Saves("third"), Saves("third"), out, {"updates": 4})
    assert (out / "weights").read_text() == "second"
    assert not (tmp_path / ".old-sft").exists()
