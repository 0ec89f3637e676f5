"""The SFT's training: the expert's conversations (mmrl/sft/data.py), trained on the action tokens
only with the learner's batch and log-prob code, checked and kept by strength (mmrl/sft/config.py).

Training is a full fine-tune (every weight of the model, vision tower included) or a LoRA adapter
merged into the saved model (`finetune`), with the token-mean negative log-likelihood of the action
tokens (<|im_end|> included), AdamW with the training settings' warm-up and schedule, on the learner's
code path: one rank or several (`mmrl sft --nproc N`, FSDP2), float32 on CPU or bfloat16 on GPU
(mmrl/sft/ranks.py). The result is a standard HF model directory that `mmrl serve rollout --model`
and the learner load.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mmrl.report.machine import machine_info
from mmrl.sft import ranks
from mmrl.sft.config import SftConfig, kept_update
from mmrl.sft.data import draw_tasks, expert_conversations, image_token_counter
from services.common.training import TrainSettings
from services.common.trajectory import Trajectory
from services.coordinator.grpo.evaluation import greedy_failures, loop_share
from services.learner.batch import ModelSpec, collate, prepare_batch
from services.learner.distributed import (
    DistContext,
    all_reduce,
    broadcast_object,
    init_distributed,
    is_sharded,
)
from services.learner.optim import build_optimizer, learning_rate_at, set_learning_rate
from services.learner.policy import load_processor, token_logprobs, trainable_parameters
from services.learner.trainer import micro_batches

log = logging.getLogger("mmrl.sft")
Check = Callable[[Path, list[Any]], dict[str, Any]]


def train_sft(config: SftConfig, env_address: str, progress: Callable[[str], None] = print,
              check: Check | None = None) -> dict[str, Any]:
    """Builds the data, fine-tunes, saves the model directory; returns a report (rank 0; {} on the
    others, which run it too under `mmrl sft --nproc N`). With `band`, rank 0's
    `check(model_dir, validation_specs)` evaluates a checkpoint on the validation tasks and returns the
    eval summary (`greedy_solve_rate`, `greedy_failed_<mode>` for each failure mode, `episodes`;
    `sampled_solve_rate`, `sampled_episodes` with `check_samples`). Each check records the greedy rate
    and the share that failed in a loop (`validation_loops`), which the band does not read."""
    from transformers import AutoConfig

    started = time.perf_counter()
    ctx = init_distributed(config.device)
    if config.band is not None and check is None and ctx.is_main:
        raise ValueError("band needs a check: the validation solve rate of a checkpoint")
    if not ctx.is_main:
        progress = _silent
    torch.manual_seed(config.seed)
    processor = load_processor(Path(config.base_model))
    model = ranks.build_model(config, ctx)
    spec = ModelSpec.from_config(AutoConfig.from_pretrained(config.base_model))

    tasks = draw_tasks(env_address, config)
    data = expert_conversations(env_address, config, tasks.training, processor.tokenizer,
                                image_token_counter(processor, spec))
    num_actions = sum(t.num_generated_tokens for t in data)
    progress(f"sft data: {len(data)} expert conversations of {len(tasks.training)} tasks, {num_actions} action "
             f"tokens; {len(tasks.validation)} validation tasks ({time.perf_counter() - started:.1f} s)")

    rng = random.Random(config.seed)
    order: list[int] = []

    def next_batch() -> list[Trajectory]:
        if len(order) < config.batch_size:
            order.extend(rng.sample(range(len(data)), len(data)))
        picked = [data[i] for i in order[: config.batch_size]]
        del order[: config.batch_size]
        return picked

    checks: list[dict[str, Any]] = []

    def after_update(update: int, history: list[dict[str, Any]]) -> bool:
        """Intermediate saves and checks; True ends the SFT (`stop_above_band`), on every rank."""
        is_check = config.is_check(update)
        if not (is_check or update in config.save_at):
            return False
        # The last update's model goes to `out` itself; earlier ones to <out>-u<N>.
        saved = Path(config.out) if update == config.updates else Path(f"{config.out}-u{update}")
        ranks.save_model(model, processor, config, ctx, saved,
                         {"config": config.model_dump(), "updates": update, "loss_history": history},
                         _swap_in)
        if is_check and config.stop_above_band:
            return bool(broadcast_object(_check(update, saved) if ctx.is_main else None, ctx))
        if is_check and ctx.is_main:
            _check(update, saved)
        return False

    def _check(update: int, saved: Path) -> bool:
        """Rank 0: the check of the model saved after `update`; whether the SFT stops there."""
        assert check is not None
        summary = check(saved, tasks.validation)
        rate = float(summary["greedy_solve_rate"])
        loops = loop_share(greedy_failures(summary))
        entry = {"updates": update, "validation_solve_rate": rate, "validation_loops": loops,
                 "episodes": summary["episodes"]}
        sampled = ""
        if config.check_samples:
            entry["validation_sampled_rate"] = float(summary["sampled_solve_rate"])
            entry["sampled_episodes"] = summary["sampled_episodes"]
            sampled = f", sampled {entry['validation_sampled_rate']:.4f} ({config.check_samples} per task)"
        checks.append(entry)
        progress(f"sft check at update {update}: greedy solve rate {rate:.4f} (failed in a loop {loops:.4f}){sampled} "
                 f"on {len(tasks.validation)} validation tasks ({time.perf_counter() - started:.0f} s)")
        _remove_unkept(config, checks, keep=kept_update(config.band, checks, ran=update, band_on=config.band_on))
        stops = config.stops_after(checks)
        if stops:
            progress(f"sft stops at update {update} of {config.updates}: its check lies above the band "
                     f"{list(config.band or ())} (stop_above_band)")
        return stops

    history = _Fitter(model, spec, processor, config, ctx, progress, started).run(next_batch, after_update)
    kept = int(broadcast_object(kept_update(config.band, checks, ran=len(history), band_on=config.band_on)
                                if ctx.is_main else None, ctx))
    report = {
        "config": config.model_dump(), "fingerprint": config.fingerprint(), "num_conversations": len(data),
        "num_action_tokens": num_actions, "updates": kept,
        "task_seeds": {"training": [t.seed for t in tasks.training], "validation": [t.seed for t in tasks.validation]}, "updates_run": len(history),
        "final_loss": history[kept - 1]["loss"] if kept else None, "loss_history": history[:kept],
        "sft_wall_s": time.perf_counter() - started,
        "kind": "full-fine-tune" if config.finetune == "full" else "lora-merged", "ranks": ctx.world_size,
        "dtype": str(ranks.compute_dtype(config, ctx)).removeprefix("torch."), "machine": machine_info(),
    }
    if checks:
        report["checks"] = checks
        report["band"] = list(config.band or ())
        report["band_on"] = config.band_on
    # The model of update `config.updates` is `out` itself (saved there at its check, or now); any other
    # update's model was saved for its check as <out>-u<N> and is moved to `out`.
    if kept == config.updates and not config.is_check(kept):
        ranks.save_model(model, processor, config, ctx, Path(config.out), report, _swap_in)
    if not ctx.is_main:
        return {}
    if kept != config.updates:
        progress(f"sft keeps the checkpoint of update {kept} (band {list(config.band or ())} on the "
                 f"{config.band_on} rate)")
        _keep_checkpoint(Path(f"{config.out}-u{kept}"), Path(config.out), report, move=kept not in config.save_at)
    else:
        (Path(config.out) / "sft_report.json").write_text(json.dumps(report, indent=2))
    _remove_unkept(config, checks, keep=kept)  # the one kept was moved to `out`
    log.info("sft saved", extra={"out": config.out, "updates": kept, "wall_s": report["sft_wall_s"]})
    return report


def _remove_unkept(config: SftConfig, checks: list[dict[str, Any]], keep: int) -> None:
    """Deletes the checkpoints saved only for a check, but for `keep`'s: the last update's model is `out`
    itself, and `save_at` asked for its own. During the SFT this leaves at most one checkpoint beside
    `out`, the one the SFT would keep if it ended there."""
    for entry in checks:
        update = entry["updates"]
        if update not in (keep, config.updates) and update not in config.save_at:
            shutil.rmtree(f"{config.out}-u{update}", ignore_errors=True)


class _Fitter:
    """Updates with the token-mean NLL of the trained tokens, AdamW and the config's schedule."""

    def __init__(self, model: Any, spec: ModelSpec, processor: Any, config: SftConfig, ctx: DistContext,
                 progress: Callable[[str], None], started: float) -> None:
        self.model, self.spec, self.processor, self.config, self.ctx = model, spec, processor, config, ctx
        self.progress, self.started = progress, started
        self.sharded = is_sharded(ctx, ranks.compute_dtype(config, ctx))

    def run(self, next_batch: Callable[[], list[Trajectory]],
            after_update: Callable[[int, list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        """`config.updates` optimiser updates, `after_update(update, history)` after each; ends early
        when it returns True."""
        config, model, ctx = self.config, self.model, self.ctx
        schedule = TrainSettings(optim=config.optim, total_steps=max(config.updates, config.optim.warmup_steps + 1))
        params = [p for _, p in trainable_parameters(model)]
        optimizer = build_optimizer(params, schedule)
        history: list[dict[str, Any]] = []
        for update in range(1, config.updates + 1):
            # Prepared per update (not all up front): pixel values of every frame would not fit memory.
            # Every rank draws the same batch and trains on its share: the loss is normalised by the whole
            # batch's token count and scaled by the world size, as FSDP2 averages the ranks' gradients.
            picked = prepare_batch(next_batch(), self.spec, self.processor.image_processor)
            total_tokens = sum(p.num_generated for p in picked)
            set_learning_rate(optimizer, learning_rate_at(update - 1, schedule))
            optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros(())
            for chunk in micro_batches(ranks.this_ranks_share(picked, ctx), config.optim.micro_batch_size):
                batch = collate(chunk, self.spec.pad_token_id, self.spec.image_token_id)
                logprobs, _ = token_logprobs(model, batch, ctx.device, with_entropy=False)
                mask = (batch.loss_mask * batch.weights[:, None]).to(logprobs.device)
                loss = -(logprobs * mask).sum() / total_tokens * ctx.world_size
                loss.backward()
                loss_sum += loss.detach().float().cpu() / ctx.world_size
            if self.sharded:
                torch.nn.utils.clip_grad_norm_(params, config.optim.max_grad_norm, foreach=False)
            else:
                torch.nn.utils.clip_grad_norm_(params, config.optim.max_grad_norm)
            optimizer.step()
            loss_value = float(all_reduce(loss_sum))
            history.append({"update": update, "loss": loss_value})
            if update % 25 == 0 or update == config.updates:
                self.progress(f"sft update {update}/{config.updates}  nll/token {loss_value:.4f}  "
                              f"({time.perf_counter() - self.started:.0f} s)")
            if after_update(update, history):
                break
        return history


def _silent(message: str) -> None:
    """Progress of ranks other than 0: they train the same updates, rank 0 reports them."""


def _keep_checkpoint(checkpoint: Path, out: Path, report: dict[str, Any], move: bool) -> None:
    """Makes an intermediate checkpoint the SFT's model: moved (or, for one `save_at` keeps, copied) next to
    `out` with the final report, then swapped in as `_save` does."""
    tmp = out.parent / f".tmp-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    if move:
        checkpoint.rename(tmp)
    else:
        shutil.copytree(checkpoint, tmp)
    (tmp / "sft_report.json").write_text(json.dumps(report, indent=2))
    _swap_in(tmp, out)


def _swap_in(tmp: Path, out: Path) -> None:
    """Renames the complete model directory `tmp` to `out`, keeping the previous `out` until it is in place."""
    old = out.parent / f".old-{out.name}"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        if old.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
