"""The SFT's training: a short run learns the expert's moves and saves a loadable model; checks keep the
checkpoint the band asks for and delete the others as they go; a failed save keeps the old model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mmrl.sft.config import SftConfig
from mmrl.sft.train import train_sft
from services.env.sokoban.env import SokobanEnv
from tests.env_service import with_env_service

FAST = {"batch_size": 4, "optim": {"micro_batch_size": 4, "warmup_steps": 0, "learning_rate": 3e-3}}


def _summary(greedy: float, episodes: int, stuck: float = 0.0, cycling: float = 0.0) -> dict[str, object]:
    """A check's eval summary: its greedy rate and how the failed episodes failed."""
    return {"greedy_solve_rate": greedy, "episodes": episodes, "greedy_failed_stuck": stuck,
            "greedy_failed_cycling": cycling, "greedy_failed_other": 1.0 - greedy - stuck - cycling}


def _weights_digest(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize("env", ["maze", "sokoban"])
def test_a_short_sft_learns_the_expert_moves_and_saves_a_loadable_model(
        tiny_model_dir: Path, tmp_path: Path, env: str) -> None:
    from transformers import AutoModelForImageTextToText

    options = {"size": "9"} if env == "maze" else {"size": "5", "pulls": "4"}
    config = SftConfig(base_model=str(tiny_model_dir), out=str(tmp_path / "sft"), env=env, options=options,
                       num_tasks=8, updates=8, **FAST)  # type: ignore[arg-type]
    report = with_env_service(lambda address: train_sft(config, address, lambda _m: None),
                              SokobanEnv() if env == "sokoban" else None)
    losses = [h["loss"] for h in report["loss_history"]]
    assert report["num_conversations"] == 8  # every expert episode solves its task
    assert losses[-1] < 0.5 * losses[0]
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "sft")
    assert model.config.image_token_id
    saved = json.loads((tmp_path / "sft" / "sft_report.json").read_text())
    assert saved["updates"] == 8 and saved["fingerprint"] == config.fingerprint()


def test_checks_keep_the_last_checkpoint_inside_the_band_and_delete_the_others_as_they_go(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """band [0.3, 0.5]: checks after updates 2, 4, 6 and 8 read 0.2, 0.7, 0.4 and 0.8 (scripted); the SFT
    runs its 8 updates and keeps update 6's weights, the last inside the band, each check playing the
    validation tasks drawn with the training ones."""
    out = tmp_path / "sft"
    config = SftConfig(base_model=str(tiny_model_dir), out=str(out), num_tasks=4, updates=8, band=(0.3, 0.5),
                       check_from=2, check_every=2, check_tasks=3, **FAST)  # type: ignore[arg-type]
    rates = iter([0.2, 0.7, 0.4, 0.8])
    digests: dict[int, str] = {}
    beside: dict[int, list[str]] = {}  # what the output's folder held while each check ran
    validated: list[list[int]] = []

    def check(model_dir: Path, tasks: list[object]) -> dict[str, object]:
        update = int(json.loads((model_dir / "sft_report.json").read_text())["updates"])
        digests[update] = _weights_digest(model_dir)
        beside[update] = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
        validated.append([t.seed for t in tasks])  # type: ignore[attr-defined]
        return _summary(next(rates), len(tasks))

    report = with_env_service(lambda address: train_sft(config, address, lambda _m: None, check=check))
    assert [c["updates"] for c in report["checks"]] == [2, 4, 6, 8]
    assert report["updates"] == 6 and report["updates_run"] == 8 and report["band"] == [0.3, 0.5]
    assert len(set(digests.values())) == 4
    assert _weights_digest(out) == digests[6]
    assert json.loads((out / "sft_report.json").read_text())["updates"] == 6
    assert beside == {2: ["sft-u2"], 4: ["sft-u2", "sft-u4"], 6: ["sft-u2", "sft-u6"], 8: ["sft", "sft-u6"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]
    assert len(validated) == 4 and len(set(map(tuple, validated))) == 1 and len(validated[0]) == 3
    assert report["task_seeds"]["validation"] == validated[0]
    assert len(report["task_seeds"]["training"]) == 4 and not set(report["task_seeds"]["training"]) & set(validated[0])


def test_a_band_on_the_sampled_rate_keeps_by_it_and_the_report_has_both_rates_and_the_loops(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """band [0.3, 0.5] on the sampled rate: checks after updates 2 and 4 read greedy 0.4 / 0.6 and sampled
    0.2 / 0.45 (scripted), so the greedy rate would keep update 2 and the sampled one keeps update 4; each
    check also records the share of greedy episodes that failed stuck or cycling (0.25 + 0.125)."""
    out = tmp_path / "sft"
    config = SftConfig(base_model=str(tiny_model_dir), out=str(out), num_tasks=4, updates=4, band=(0.3, 0.5),
                       check_from=2, check_every=2, check_tasks=3, check_samples=2, band_on="sampled",
                       **FAST)  # type: ignore[arg-type]
    rates = iter([(0.4, 0.2), (0.6, 0.45)])

    def check(model_dir: Path, tasks: list[object]) -> dict[str, object]:
        greedy, sampled = next(rates)
        return {**_summary(greedy, len(tasks), stuck=0.25, cycling=0.125), "sampled_solve_rate": sampled,
                "sampled_episodes": 2 * len(tasks)}

    report = with_env_service(lambda address: train_sft(config, address, lambda _m: None, check=check))
    assert report["checks"] == [
        {"updates": 2, "validation_solve_rate": 0.4, "validation_loops": 0.375, "episodes": 3,
         "validation_sampled_rate": 0.2, "sampled_episodes": 6},
        {"updates": 4, "validation_solve_rate": 0.6, "validation_loops": 0.375, "episodes": 3,
         "validation_sampled_rate": 0.45, "sampled_episodes": 6}]
    assert report["updates"] == 4 and report["band_on"] == "sampled"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]


def test_stop_above_band_ends_at_the_first_check_above_it_and_keeps_the_last_inside(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """band [0.3, 0.5], a ceiling of 12 updates: checks after updates 2, 4 and 6 read 0.1, 0.4 and 0.7
    (scripted); the SFT stops after update 6 and keeps update 4's weights, with no other checkpoint left."""
    out = tmp_path / "sft"
    config = SftConfig(base_model=str(tiny_model_dir), out=str(out), num_tasks=4, updates=12, band=(0.3, 0.5),
                       check_from=2, check_every=2, check_tasks=3, stop_above_band=True,
                       **FAST)  # type: ignore[arg-type]
    rates = iter([0.1, 0.4, 0.7])
    digests: dict[int, str] = {}
    messages: list[str] = []

    def check(model_dir: Path, tasks: list[object]) -> dict[str, object]:
        digests[int(json.loads((model_dir / "sft_report.json").read_text())["updates"])] = _weights_digest(model_dir)
        return _summary(next(rates), len(tasks))

    report = with_env_service(lambda address: train_sft(config, address, messages.append, check=check))
    assert [c["updates"] for c in report["checks"]] == [2, 4, 6]
    assert report["updates"] == 4 and report["updates_run"] == 6 and len(report["loss_history"]) == 4
    assert _weights_digest(out) == digests[4]
    assert json.loads((out / "sft_report.json").read_text())["updates"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]
    assert any("stops at update 6 of 12" in m for m in messages)


def test_a_band_needs_a_check(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = SftConfig(base_model=str(tiny_model_dir), out=str(tmp_path / "sft"), updates=2, band=(0.4, 0.5),
                       check_from=2)
    with pytest.raises(ValueError, match="band needs a check"):
        train_sft(config, "127.0.0.1:1", lambda _m: None)


def test_saving_over_a_model_swaps_it_in_and_a_failed_save_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmrl.sft import ranks
    from mmrl.sft.train import _swap_in
    from services.learner.distributed import init_distributed

    config, ctx = SftConfig(base_model="m", out="o", dtype="float32", device="cpu"), init_distributed("cpu")

    def _save(model: Saves, processor: Saves, out: Path, report: dict[str, int]) -> None:
        ranks.save_model(model, processor, config, ctx, out, report, _swap_in)

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
