"""SFT: expert data through a real env service, the seed ranges it may use, and the checks that stop it."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from pydantic import ValidationError

from mmrl.sft.train import SftConfig, train_sft
from tests.learner.env_service import with_env_service

T = TypeVar("T")


def _with_env_service(work: Callable[[str], T]) -> T:
    return with_env_service(work)


def test_sft_data_can_never_reach_the_eval_seed_range() -> None:
    """The config is refused unless the mazes it will play, which skip the layouts reserved for
    eval sets, all lie below the eval seed range."""
    from services.env.kit.seeds import TRAIN_SEED_LIMIT
    from services.env.maze.maze import is_training_seed

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

    from mmrl.sft.train import expert_conversations
    from services.env.maze.evalset import get_eval_set
    from services.env.maze.maze import is_eval_layout, layout_key

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

    from mmrl.sft.train import expert_conversations

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

    from mmrl.sft.train import READING_QUESTION, frame_reading_questions
    from mmrl_proto.v1 import env_pb2, env_pb2_grpc

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
    from mmrl.sft import ranks as sft_ranks
    from mmrl.sft.train import _swap_in
    from services.learner.distributed import init_distributed

    config, ctx = SftConfig(base_model="m", out="o", dtype="float32", device="cpu"), init_distributed("cpu")

    def _save(model: Saves, processor: Saves, out: Path, report: dict[str, int]) -> None:
        sft_ranks.save_model(model, processor, config, ctx, out, report, _swap_in)

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


def _weights_digest(model_dir: Path) -> str:
    import hashlib

    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


def test_checks_end_the_sft_above_the_bar_and_keep_the_last_checkpoint_at_or_below_it(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """stop_above: checks after updates 2, 4 and 6 read 0.2, 0.5 and 0.7 (scripted); the third is above
    0.5, so the SFT stops there, before its 8 updates, and keeps update 4's weights."""
    out = tmp_path / "sft"
    config = SftConfig(base_model=str(tiny_model_dir), out=str(out), num_mazes=4, updates=8, batch_size=4,
                       micro_batch_size=4, warmup_steps=0, learning_rate=3e-3, stop_above=0.5, check_from=2,
                       check_every=2, check_mazes=4, save_at=[2])
    rates = iter([0.2, 0.5, 0.7])
    digests: dict[int, str] = {}

    def check(model_dir: Path) -> dict[str, object]:
        update = int(json.loads((model_dir / "sft_report.json").read_text())["updates"])
        digests[update] = _weights_digest(model_dir)
        return {"greedy_solve_rate": next(rates), "episodes": 4}

    report = _with_env_service(lambda address: train_sft(config, address, lambda _m: None, check=check))
    assert [c["updates"] for c in report["checks"]] == [2, 4, 6]
    assert report["updates"] == 4 and report["updates_run"] == 6 and len(report["loss_history"]) == 4
    assert len(set(digests.values())) == 3  # each check saw other weights
    assert _weights_digest(out) == digests[4]
    assert json.loads((out / "sft_report.json").read_text())["updates"] == 4
    # Checkpoints saved only for a check are gone; the one save_at asked for stays.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft", "sft-u2"]


def test_keep_last_at_or_below_runs_every_update_and_keeps_the_last_check_inside_the_bar(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """keep last_at_or_below: checks after updates 2, 4, 6 and 8 read 0.2, 0.7, 0.4 and 0.8 (scripted);
    the check above the bar at 4 does not end the SFT, which runs its 8 updates and keeps update 6's
    weights, the last at or below 0.5. Checkpoints no longer in the running are deleted as it goes."""
    out = tmp_path / "sft"
    config = SftConfig(base_model=str(tiny_model_dir), out=str(out), num_mazes=4, updates=8, batch_size=4,
                       micro_batch_size=4, warmup_steps=0, learning_rate=3e-3, stop_above=0.5, check_from=2,
                       check_every=2, check_mazes=4, keep="last_at_or_below")
    rates = iter([0.2, 0.7, 0.4, 0.8])
    digests: dict[int, str] = {}
    beside: dict[int, list[str]] = {}  # what the output's folder held while each check ran

    def check(model_dir: Path) -> dict[str, object]:
        update = int(json.loads((model_dir / "sft_report.json").read_text())["updates"])
        digests[update] = _weights_digest(model_dir)
        beside[update] = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
        return {"greedy_solve_rate": next(rates), "episodes": 4}

    report = _with_env_service(lambda address: train_sft(config, address, lambda _m: None, check=check))
    assert [c["updates"] for c in report["checks"]] == [2, 4, 6, 8]
    assert report["updates"] == 6 and report["updates_run"] == 8 and report["keep"] == "last_at_or_below"
    assert len(set(digests.values())) == 4
    assert _weights_digest(out) == digests[6]
    assert json.loads((out / "sft_report.json").read_text())["updates"] == 6
    assert beside == {2: ["sft-u2"], 4: ["sft-u2", "sft-u4"], 6: ["sft-u2", "sft-u6"], 8: ["sft", "sft-u6"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]


def test_keep_last_at_or_below_needs_the_last_update_checked() -> None:
    from mmrl.sft.train import _kept_update

    with pytest.raises(ValidationError, match="needs a check after the last update: 950"):
        SftConfig(base_model="m", out="o", updates=950, stop_above=0.55, keep="last_at_or_below")
    config = SftConfig(base_model="m", out="o", updates=1200, stop_above=0.55, keep="last_at_or_below")
    rates = (0.44, 0.66, 0.44, 0.50, 0.61, 0.53, 0.65, 0.80)  # one machine's checks, 500..1200
    checks = [{"updates": 500 + 100 * i, "validation_solve_rate": r} for i, r in enumerate(rates)]
    assert _kept_update(config, checks, ran=1200) == 1000
    assert _kept_update(config.model_copy(update={"keep": "before_first_above"}), checks[:2], ran=600) == 500
    above = [{"updates": u, "validation_solve_rate": 0.9} for u in (500, 600)]
    assert _kept_update(config, above, ran=1200) == 500  # none inside the bar: the first one checked
    plain = {"base_model": "m", "out": "o", "updates": 1200, "stop_above": 0.55}
    assert SftConfig(**plain).fingerprint() == SftConfig(**plain, keep="before_first_above").fingerprint()
    assert SftConfig(**plain).fingerprint() != config.fingerprint()


def test_without_a_check_above_the_bar_the_sft_runs_its_updates_and_keeps_the_last() -> None:
    from mmrl.sft.train import _kept_update

    config = SftConfig(base_model="m", out="o", updates=900, stop_above=0.55, check_from=500, check_every=100)
    assert [u for u in range(1, 901) if config.is_check(u)] == [500, 600, 700, 800, 900]
    below = [{"updates": u, "validation_solve_rate": 0.4} for u in (500, 600, 700)]
    assert _kept_update(config, below, ran=900) == 900
    above_first = [{"updates": 500, "validation_solve_rate": 0.6}]
    assert _kept_update(config, above_first, ran=500) == 500  # nothing earlier was checked
    assert not SftConfig(base_model="m", out="o", updates=900).is_check(500)  # no stop_above: no checks


def test_checks_need_a_check_and_a_check_before_the_last_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="check_from 950 is after the last update"):
        SftConfig(base_model="m", out="o", updates=900, stop_above=0.5, check_from=950)
    config = SftConfig(base_model=str(tiny_model_dir), out=str(tmp_path / "sft"), updates=2, stop_above=0.5,
                       check_from=1)
    with pytest.raises(ValueError, match="stop_above needs a check"):
        train_sft(config, "127.0.0.1:1", lambda _m: None)
    plain = {"base_model": "m", "out": "o", "updates": 900}
    checked = SftConfig(**plain, stop_above=0.55).fingerprint()
    assert SftConfig(**plain).fingerprint() != checked != SftConfig(**plain, stop_above=0.5).fingerprint()
    assert checked != SftConfig(**plain, stop_above=0.55, check_every=50).fingerprint()


def test_validation_mazes_are_training_mazes_the_sft_never_plays() -> None:
    from mmrl.sft.train import check_seeds
    from services.env.maze.maze import is_training_seed, layout_key

    config = SftConfig(base_model="m", out="o", updates=900, stop_above=0.55, check_mazes=128)
    seeds = check_seeds(config)
    keys = [layout_key(s, 9) for s in seeds]
    sft_layouts = {layout_key(s, 9) for s in config.maze_seeds()}
    assert len(seeds) == len(set(keys)) == 128 and seeds[0] >= config.check_first_seed
    assert all(is_training_seed(s, 9) for s in seeds) and not sft_layouts & set(keys)
    assert len(sft_layouts & {layout_key(s, 9) for s in range(seeds[0], seeds[-1])}) > 100  # what skipping avoids
    with pytest.raises(ValueError, match="reach the eval seed range"):
        check_seeds(config.model_copy(update={"check_first_seed": 999_990}))


@pytest.mark.parametrize("name", ["sft-tiny.yaml", "sft-tiny-long.yaml"])
def test_the_shipped_sft_configs_load(name: str) -> None:
    from mmrl.cli.sft import load_sft_config

    config = load_sft_config(Path(__file__).resolve().parents[2] / "configs" / name, None, None)
    if name == "sft-tiny.yaml":  # the demo's start: the last check inside the 30-55% band's top
        assert config.stop_above == 0.55 and config.is_check(config.check_from) and config.check_from < config.updates
        assert config.keep == "last_at_or_below" and config.is_check(config.updates)
    else:
        assert config.stop_above is None and config.updates == 1500
