"""`mmrl sft` on several ranks (torchrun, gloo on CPU, FSDP2): two ranks train what one rank trains,
and a LoRA SFT in bfloat16 (the 8B path: the base built shard by shard) saves a merged model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrl.cli.sft import run_sft
from mmrl.sft.config import SftConfig

pytestmark = pytest.mark.slow


def _weights(model_dir: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _config(tiny_model_dir: Path, out: Path, **settings: object) -> SftConfig:
    optim = {"micro_batch_size": 2, "warmup_steps": 0, "learning_rate": settings.pop("learning_rate", 3e-3)}
    given: dict[str, object] = {"num_tasks": 8, "updates": 3, "batch_size": 4, "optim": optim, "device": "cpu",
                                **settings}
    return SftConfig(base_model=str(tiny_model_dir), out=str(out), **given)  # type: ignore[arg-type]


def test_two_ranks_train_what_one_rank_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    one = run_sft(_config(tiny_model_dir, tmp_path / "one"), tmp_path / "state-1", evaluate_after=False, quiet=True)
    two = run_sft(_config(tiny_model_dir, tmp_path / "two"), tmp_path / "state-2", evaluate_after=False, quiet=True,
                  nproc=2)
    assert (one["ranks"], two["ranks"]) == (1, 2) and one["kind"] == two["kind"] == "full-fine-tune"
    assert [h["loss"] for h in two["loss_history"]] == pytest.approx([h["loss"] for h in one["loss_history"]],
                                                                     rel=1e-4)
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    base = _weights(tiny_model_dir)
    assert set(a) == set(b)
    moved = max(float((a[k] - base[k]).abs().max()) for k in a)  # type: ignore[operator]
    apart = max(float((a[k] - b[k]).abs().max()) for k in a)  # type: ignore[operator]
    assert moved > 1e-3 and apart < 0.05 * moved, (moved, apart)


def test_a_lora_sft_in_bfloat16_on_two_ranks_saves_the_adapter_merged(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText

    out = tmp_path / "lora"
    config = _config(tiny_model_dir, out, finetune="lora", dtype="bfloat16", learning_rate=1e-2,
                     lora={"rank": 8, "alpha": 16})
    report = run_sft(config, tmp_path / "state", evaluate_after=False, quiet=True, nproc=2)
    assert (report["kind"], report["ranks"], report["dtype"]) == ("lora-merged", 2, "bfloat16")
    losses = [h["loss"] for h in report["loss_history"]]
    assert losses[-1] < losses[0]
    merged, base = _weights(out), _weights(tiny_model_dir)
    assert set(merged) == set(base)  # a plain model: no adapter keys
    changed = [k for k in base if not (merged[k] == base[k]).all()]  # type: ignore[union-attr]
    assert changed and all("language_model" in k and "proj" in k for k in changed)  # LoRA's targets only
    AutoModelForImageTextToText.from_pretrained(out)
    assert json.loads((out / "sft_report.json").read_text())["kind"] == "lora-merged"
