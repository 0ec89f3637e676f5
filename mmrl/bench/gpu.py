"""`mmrl bench gpu` (scripts/gpu-check.sh, `python -m mmrl.bench.gpu`): one command that
shows the learner works on a GPU, in minutes, with nothing downloaded. Prints one JSON object as its
last line.

On a random-initialised Qwen3-VL-architecture model of a few billion parameters (Qwen3-VL-8B's text
shape, hidden 4096 / intermediate 12288 / 32 query and 8 key-value heads of 128, its vocabulary
size, fewer layers), built on the GPU in bfloat16 (no weights on disk):
- the learner as the service runs it: a process group of one on NCCL, FSDP2 `fully_shard` with
  bfloat16 gathers and float32 gradient reduction, a peft LoRA adapter (float32), AdamW, and
  `trainer.train_step` on multi-turn maze trajectories with images; step time, tokens per second
  and peak GPU memory, with and without activation checkpointing;
- `logprob_abs_diff_bf16_vs_fp32`: the learner's log-probs of the same batch from the bfloat16
  model and from the same weights in float32 (a stand-in for the rollout agreement when vLLM is
  absent: it bounds what bfloat16 alone costs);
- the sharded loader (weights.build_policy) on the GPU, from a tiny checkpoint, checked against the
  checkpoint's values;
- vLLM on the GPU, when installed (reported as skipped, with the reason, when not), through the
  rollout service's engine and adapter registry in a process of its own (mmrl/bench/gpu_vllm.py):
  engine start, adapter load with the adapter probe, generation tokens/s, sleep and wake ms, and the
  learner/vLLM log-prob agreement on what vLLM generated.
The learner parts import torch, transformers, peft, safetensors, numpy and pillow only (no pydantic,
protobuf or gRPC); the vLLM part needs what the rollout service needs. Without CUDA it stops at once with one line naming it; `--device cpu --tiny` runs the same
code on a tiny model on the CPU (the tests do).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from services.common.messages import summary

QWEN3_VL_VOCAB = 151_936
# TrainSettings' defaults (services/common/training.py; a test keeps the two equal), usable where
# pydantic is not installed.
RUN_DEFAULTS: dict[str, Any] = {
    "lora": {
        "rank": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": (
            r".*language_model\.layers\.\d+\."
            r"(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"
        ),
    },
    "optim": {
        "learning_rate": 1e-4, "warmup_steps": 0, "lr_schedule": "constant", "min_lr_ratio": 0.0,
        "weight_decay": 0.0, "adam_betas": (0.9, 0.999), "adam_eps": 1e-8, "max_grad_norm": 1.0,
        "micro_batch_size": 16, "activation_checkpointing": False, "num_minibatches": 1, "epochs": 1,
    },
    "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "entropy_coef": 0.0, "loss_agg": "token_mean",
             "tis_cap": None, "old_logprobs": "learner"},
    "seed": 0, "total_steps": None, "action_sequences": (),
}


class CheckTimeout(Exception):
    pass


def run_config(**optim: Any) -> Any:
    """The run settings with these optimiser settings: TrainSettings where pydantic is installed,
    else its defaults as namespaces."""
    try:
        from services.common.training import TrainSettings
    except ImportError:
        d = RUN_DEFAULTS
        return SimpleNamespace(lora=SimpleNamespace(**d["lora"]), optim=SimpleNamespace(**{**d["optim"], **optim}),
                               loss=SimpleNamespace(**d["loss"]), seed=d["seed"], total_steps=d["total_steps"],
                               action_sequences=d["action_sequences"])
    return TrainSettings.model_validate({"optim": optim})


def image_processor() -> Any:
    """Qwen's image processor at the tiny model's patching (torchvision's, or the PIL one without it)."""
    kwargs = {"patch_size": 8, "merge_size": 2, "temporal_patch_size": 2,
              "size": {"shortest_edge": 16 * 16, "longest_edge": 256 * 256}}
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    except ImportError:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil(**kwargs)
    return Qwen2VLImageProcessor(**kwargs)


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expire(_signum: int, _frame: Any) -> None:
        raise CheckTimeout(f"the check ran past its time limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def synthetic_batch(tokenizer: Any, frames: Any, spec: Any, groups: int, group_size: int, turns: int) -> list[Any]:
    """Multi-turn maze trajectories with one frame per turn, prepared for the learner."""
    from mmrl.bench.synthetic import fake_generator, play_episodes, with_advantages
    from services.common.conversation import ChatTokens
    from services.learner.batch import prepare_batch

    generate = fake_generator(ChatTokens.from_tokenizer(tokenizer), tokenizer, tokens_per_image=25)
    played = play_episodes(generate, tokenizer, groups, group_size, turns)
    advantages = [(-1.0) ** i * (0.5 + i % 3) for i in range(len(played))]  # a gradient that is not zero
    return prepare_batch(with_advantages(played, advantages), spec, frames)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def logprob_precision_gap(model: Any, batch: Any, device: torch.device) -> float:
    """Max |log-prob| difference over generated tokens between the model in bfloat16 and the same
    weights in float32 (the parameters are converted in place and back: bfloat16 -> float32 ->
    bfloat16 is exact; buffers stay as they are)."""
    from services.learner.policy import token_logprobs

    mask = batch.loss_mask.to(device).bool()
    with torch.no_grad():
        low, _ = token_logprobs(model, batch, device, with_entropy=False)
        for param in model.parameters():
            param.data = param.data.float()
        high, _ = token_logprobs(model, batch, device, with_entropy=False)
        for param in model.parameters():
            param.data = param.data.to(torch.bfloat16)
    return float((low - high)[mask].abs().max())


def train_phase(base: Any, items: list[Any], spec: Any, ctx: Any, steps: int, checkpointing: bool) -> dict[str, Any]:
    """The learner's path on `base` (which it wraps and shards in place): LoRA, FSDP2 in bfloat16,
    AdamW, `steps` timed train steps after one warm-up."""
    from services.learner.distributed import shard_model
    from services.learner.optim import build_optimizer
    from services.learner.policy import add_lora, trainable_parameters
    from services.learner.trainer import BatchTotals, MiniBatch, train_step

    config = run_config(micro_batch_size=8, learning_rate=1e-5, activation_checkpointing=checkpointing)
    model = shard_model(add_lora(base, config), ctx, torch.bfloat16)
    optimizer = build_optimizer((p for _, p in trainable_parameters(model)), config)
    minibatch = MiniBatch(items=items, totals=BatchTotals.of(items))
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    times, outcome = [], None
    for step in range(steps + 1):
        _sync(ctx.device)
        start = time.perf_counter()
        outcome = train_step(model, optimizer, [minibatch], config, step, spec, ctx)
        _sync(ctx.device)
        if step > 0:
            times.append(time.perf_counter() - start)
    assert outcome is not None
    step_s = statistics.median(times)
    result = {
        "activation_checkpointing": checkpointing,
        "step_s": [round(t, 4) for t in times],
        "step_s_median": round(step_s, 4),
        "train_tokens_per_s": round(minibatch.totals.num_tokens / step_s, 1),
        "generated_tokens_per_s": round(minibatch.totals.num_generated_tokens / step_s, 1),
        "loss": outcome.metrics["train/loss"],
        "grad_norm": outcome.metrics["train/grad_norm"],
        "skipped_steps": outcome.metrics["train/skipped_steps"],
        "finite": all(math.isfinite(v) for v in outcome.metrics.values()),
    }
    if ctx.device.type == "cuda":
        result["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated(ctx.device) / 2**30, 2)
    return result


def random_base(config: Any, device: torch.device) -> Any:
    """The model with random weights, made on `device` in bfloat16, frozen, in eval mode."""
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    with device:
        base = Qwen3VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    base.requires_grad_(False)
    base.eval()
    return base


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def loader_check(tokenizer: Any, ctx: Any, work: Path) -> dict[str, Any]:
    """weights.build_policy on this device from a tiny checkpoint: every value as saved."""
    from transformers import Qwen3VLForConditionalGeneration

    from mmrl.models.tiny import qwen3_vl_config
    from services.learner.weights import SafetensorsReader, build_policy, checkpoint_key

    torch.manual_seed(0)
    Qwen3VLForConditionalGeneration(qwen3_vl_config(tokenizer)).save_pretrained(work / "tiny")
    start = time.perf_counter()
    model = build_policy(work / "tiny", run_config(), ctx, torch.bfloat16)
    seconds = time.perf_counter() - start
    reader = SafetensorsReader(work / "tiny")
    worst = 0.0
    for name, param in model.named_parameters():
        if param.requires_grad:
            continue
        full = param.full_tensor() if hasattr(param, "full_tensor") else param.detach()
        key = checkpoint_key(name)
        saved = reader.rows(key, 0, reader.shape(key)[0] if reader.shape(key) else 1).to(torch.bfloat16)
        worst = max(worst, float((full.cpu().float() - saved.float()).abs().max()))
    return {"ok": worst == 0.0, "max_abs_diff": worst, "build_s": round(seconds, 3)}


def vllm_check(base: Any, tokenizer: Any, device: torch.device, work: Path, time_left_s: float,
               prompts: int) -> dict[str, Any]:
    """vLLM on this device through the rollout service's own engine and adapter registry
    (mmrl/bench/gpu_vllm.py, a process of its own): the model saved in bfloat16, a LoRA
    adapter with random B published as the learner publishes one (with its probe), then engine start,
    adapter load, generation tokens/s, sleep and wake, and the learner/vLLM log-prob agreement on
    what vLLM generated. Skipped, with the reason, where vLLM is not installed."""
    import importlib.util
    import os
    import subprocess

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": True, "reason": "vllm is not installed"}
    from mmrl.models.tiny import tiny_processor
    from services.common.adapter_probe import measure, model_logprobs, probe_token_ids
    from services.learner.policy import add_lora, trainable_parameters
    from services.learner.publish import publish_adapter

    model_dir, shared = work / "vllm-model", work / "shared"
    base.save_pretrained(model_dir, safe_serialization=True)
    tiny_processor(tokenizer).save_pretrained(model_dir)
    # The engine computes in bfloat16 on GPU, float32 on CPU: the learner's side scores in the same.
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = add_lora(base.to(dtype), run_config())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in trainable_parameters(model):
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    state = {name: param.detach() for name, param in trainable_parameters(model)}
    publish_adapter(shared, "gpu-check", 1, state, model.peft_config["default"],
                    extra_manifest=measure(model, probe_token_ids(tokenizer), device).to_manifest())
    out = work / "vllm.json"
    command = [sys.executable, "-m", "mmrl.bench.gpu_vllm", "--model", str(model_dir), "--shared-root",
               str(shared), "--run", "gpu-check", "--out", str(out), "--prompts", str(prompts)]
    if device.type == "cuda":
        command += ["--gpu-memory-utilization", "0.5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[2]),
                                                                        os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, env=env, timeout=max(time_left_s, 1), check=False, stdout=sys.stderr)
    if done.returncode != 0 or not out.is_file():
        return {"ok": False, "error": f"mmrl.bench.gpu_vllm exited with {done.returncode} (its output above)"}
    report: dict[str, Any] = json.loads(out.read_text())
    diffs = []
    for sample in report.pop("samples"):
        sequence = [*sample["prompt"], *sample["completion"]]
        learner = model_logprobs(model, sequence, device)[-len(sample["completion"]):]
        diffs += [abs(a - b) for a, b in zip(learner, sample["logprobs"], strict=True)]
    report["logprob_abs_diff_vs_learner"] = {"mean": statistics.fmean(diffs), "max": max(diffs),
                                             "tokens": len(diffs)}
    report["ok"] = report["probe"]["gap"] <= report["probe"]["tolerance"]
    return report


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    import peft
    import transformers

    from mmrl.models.tiny import build_tokenizer, qwen3_vl_config
    from services.learner.batch import FrameProcessor, ModelSpec, collate
    from services.learner.distributed import init_distributed

    report: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                              "peft": peft.__version__}
    ctx = init_distributed(args.device)
    report["device"] = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
    report["backend"] = torch.distributed.get_backend()
    tokenizer = build_tokenizer()
    if args.tiny:
        shape = {"hidden_size": 128, "num_layers": 2}
    else:
        shape = {"hidden_size": 4096, "num_layers": args.layers, "intermediate_size": 12288, "num_kv_heads": 8,
                 "head_dim": 128, "vocab_size": QWEN3_VL_VOCAB}
    config = qwen3_vl_config(tokenizer, **shape)
    spec = ModelSpec.from_config(config)
    frames = FrameProcessor(image_processor())
    items = synthetic_batch(tokenizer, frames, spec, args.groups, args.group_size, args.turns)

    start = time.perf_counter()
    base = random_base(config, ctx.device)
    _sync(ctx.device)
    report["model"] = {**shape, "num_parameters": sum(p.numel() for p in base.parameters()),
                       "build_s": round(time.perf_counter() - start, 2)}
    report["batch"] = {"num_trajectories": len(items), "num_tokens": sum(i.num_tokens for i in items),
                       "num_generated_tokens": sum(i.num_generated for i in items), "turns": args.turns}
    probe = collate(items[:8], spec.pad_token_id, spec.image_token_id)
    report["logprob_abs_diff_bf16_vs_fp32"] = logprob_precision_gap(base, probe, ctx.device)
    report["learner"] = [part(functools.partial(train_phase, base, items, spec, ctx, args.steps, False))]
    del base
    _free(ctx.device)
    report["learner"].append(part(lambda: train_phase(random_base(config, ctx.device), items, spec, ctx,
                                                      args.steps, checkpointing=True)))
    _free(ctx.device)
    with tempfile.TemporaryDirectory(prefix="mmrl-gpu-check-") as tmp:
        report["loader"] = part(lambda: loader_check(tokenizer, ctx, Path(tmp)))
    if args.vllm:
        with tempfile.TemporaryDirectory(prefix="mmrl-gpu-check-vllm-") as tmp:
            time_left = args.time_limit_s - (time.perf_counter() - args.started)
            report["vllm"] = part(lambda: vllm_check(random_base(config, ctx.device), tokenizer, ctx.device, Path(tmp),
                                                     time_left - 5, args.vllm_prompts))
        _free(ctx.device)
    else:
        report["vllm"] = {"skipped": True, "reason": "--no-vllm"}
    report["ok"] = report["loader"].get("ok", False) and report["vllm"].get("ok", True) and all(
        phase.get("finite") and phase["grad_norm"] > 0 and not phase["skipped_steps"] for phase in report["learner"]
    )
    return report


def part(run: Any) -> dict[str, Any]:
    """One part's report, or the error that stopped it (the other parts still report)."""
    try:
        result: dict[str, Any] = run()
    except CheckTimeout:
        raise
    except Exception as exc:  # noqa: BLE001 - reported in the JSON line
        import traceback

        traceback.print_exc()
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl bench gpu", description=summary(__doc__))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: only with --tiny, for tests")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (the code path, not the figures)")
    parser.add_argument("--layers", type=int, default=10, help="decoder layers of the model (10: about 3.2e9 params)")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups in the batch")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per group")
    parser.add_argument("--turns", type=int, default=10, help="turns (frames) per episode")
    parser.add_argument("--steps", type=int, default=3, help="timed train steps per phase (after one warm-up)")
    parser.add_argument("--time-limit-s", type=float, default=480.0, help="the whole check stops after this")
    parser.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True,
                        help="also check vLLM on the device when it is installed (default: on)")
    parser.add_argument("--vllm-prompts", type=int, default=64, help="requests of vLLM's timed generation")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object as the last line (it always does: accepted like every bench)")
    args = parser.parse_args(argv)
    args.started = time.perf_counter()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"mmrl bench gpu: CUDA is not available (torch {torch.__version__}, torch.cuda.is_available() is False);"
              " run it on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        parser.error("--device cpu needs --tiny (a few-billion-parameter model is for the GPU)")
    start = time.perf_counter()
    try:
        with time_limit(args.time_limit_s):
            report = run_check(args)
    except Exception as exc:  # noqa: BLE001 - the report says what failed, as its last line
        report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        import traceback

        traceback.print_exc()
    report["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report))
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
