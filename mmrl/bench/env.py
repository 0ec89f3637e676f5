"""`mmrl bench env [--json]`: throughput of the maze environment, in process and over gRPC.

Workload: rounds of `--batch-size` episodes (groups of `--group-size` episodes per maze seed, as in a
GRPO step) on `--size` mazes; each round creates the episodes, steps all of them `--moves` times with
random action texts (directions, tagged and worded answers, some garbage), then closes them. The
episodes run in require_stop mode and never say "stop", so every Step call carries the full batch.

Measured (steps/s count episode-steps inside Step calls; creation and closing are not counted):
  inproc_steps_per_s           MazeEnv.step in this process (parse, move, frame PNG, text, info),
                               frame cache on (the service default)
  inproc_uncached_steps_per_s  the same with the frame cache off (every step renders and encodes)
  render_encode_per_s          render + PNG encode of one frame alone, no cache
  grpc_steps_per_s             Step calls of a full batch over loopback gRPC to a real server started
                               as a subprocess (`python -m services.env.main`), frame cache on
  grpc_uncached_steps_per_s    the same against a server with the frame cache off
"frame_cache": true in the JSON says the headline numbers (inproc_steps_per_s, grpc_steps_per_s,
grpc_batch_p50_ms) were measured with the cache on.
Prints progress lines, then (with --json) one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmrl_proto.v1 import env_pb2, env_pb2_grpc
from services.common.grpc_server import channel
from services.common.messages import summary
from services.common.task import TaskSpec
from services.env.config import EnvConfig
from services.env.maze.env import MazeEnv
from services.env.maze.maze import generate_maze
from services.env.maze.render import MazeRenderer, encode_png

ACTION_TEXTS = (
    "up", "down", "left", "right", "Down", "<answer>left</answer>", "I will move right.", "UP!", "hmm",
)


def _say(message: str) -> None:
    print(message, flush=True)


def _specs(args: argparse.Namespace, round_index: int) -> list[TaskSpec]:
    options = {"size": str(args.size), "unit_px": str(args.unit_px), "require_stop": "true"}
    num_seeds = max(1, args.batch_size // args.group_size)
    return [
        TaskSpec(seed=(round_index * num_seeds + i % num_seeds) % 1_000_000, max_moves=args.moves, options=options)
        for i in range(args.batch_size)
    ]


def _action_batches(args: argparse.Namespace) -> list[list[str]]:
    rng = random.Random(0)
    return [[rng.choice(ACTION_TEXTS) for _ in range(args.batch_size)] for _ in range(args.moves)]


def bench_inproc(args: argparse.Namespace, frame_cache: bool) -> float:
    """Episode-steps per second of MazeEnv.step, one process, one thread."""
    env = MazeEnv(_config(args, frame_cache))
    batches = _action_batches(args)
    num_steps, step_time, round_index = 0, 0.0, 0
    deadline = time.perf_counter() + args.seconds
    while time.perf_counter() < deadline or round_index < 2:
        ids = [episode.episode_id for episode in env.create(_specs(args, round_index))]
        for texts in batches:
            actions = [env_pb2.EpisodeAction(episode_id=i, action=t) for i, t in zip(ids, texts, strict=True)]
            started = time.perf_counter()
            env.step(actions)
            if round_index > 0:  # round 0 warms up
                step_time += time.perf_counter() - started
                num_steps += len(actions)
        env.close(ids)
        round_index += 1
    return num_steps / step_time


def bench_render(args: argparse.Namespace) -> tuple[float, int]:
    """Uncached renders + PNG encodes per second, and the mean PNG size in bytes."""
    renderers = [MazeRenderer(generate_maze(seed, args.size), args.unit_px, cache=False) for seed in range(16)]
    n = renderers[0].maze.num_cells_per_side
    cells = [(r, c) for r in range(n) for c in range(n)]
    sizes = [len(renderer.render(cell)) for renderer in renderers for cell in cells]
    num_frames, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds / 2:
        for renderer in renderers:
            for cell in cells:
                encode_png(renderer.pixels(cell))
        num_frames += len(renderers) * len(cells)
    return num_frames / (time.perf_counter() - started), round(statistics.mean(sizes))


def _config(args: argparse.Namespace, frame_cache: bool) -> EnvConfig:
    """The env settings of both measurements: room for a whole batch in one call."""
    return EnvConfig(frame_cache=frame_cache, max_batch=max(4096, args.batch_size),
                     max_live_episodes=max(16384, args.batch_size))


@contextmanager
def server_subprocess(config: EnvConfig) -> Iterator[str]:
    """Starts `python -m services.env.main` with `config` on a free loopback port; yields its address."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path, config_path = Path(tmp) / "server.log", Path(tmp) / "env.yaml"
        config_path.write_text(json.dumps(config.model_dump(mode="json")) + "\n")
        with log_path.open("w") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.env.main", "--host", "127.0.0.1", "--port", "0",
                 "--config", str(config_path), "--log-level", "INFO"],
                stderr=log_file, stdout=subprocess.DEVNULL,
            )
            try:
                yield f"127.0.0.1:{wait_for_port(log_path, process)}"
            finally:
                process.terminate()
                process.wait(timeout=30)


def wait_for_port(log_path: Path, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    """The port a starting server logs ("grpc server listening") to `log_path`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines(keepends=True):
            if line.startswith("{") and line.endswith("\n"):  # complete JSON log lines only
                record = json.loads(line)
                if record.get("msg") == "grpc server listening":
                    return int(record["port"])
        if process.poll() is not None:
            raise RuntimeError(f"env server exited with {process.returncode}: {log_path.read_text()}")
        time.sleep(0.05)
    raise TimeoutError("env server did not report its port")


async def bench_grpc(args: argparse.Namespace, address: str) -> tuple[float, list[float]]:
    """Episode-steps per second of full-batch Step calls, and each call's latency in ms."""
    batches = _action_batches(args)
    latencies: list[float] = []
    num_steps, step_time, round_index = 0, 0.0, 0
    async with channel(address) as ch:
        stub = env_pb2_grpc.EnvServiceStub(ch)
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline or round_index < 2:
            specs = [env_pb2.EpisodeSpec(seed=s.seed, max_moves=s.max_moves, options=s.options)
                     for s in _specs(args, round_index)]
            created = await stub.CreateEpisodes(env_pb2.CreateEpisodesRequest(specs=specs))
            ids = [episode.episode_id for episode in created.episodes]
            for texts in batches:
                request = env_pb2.StepRequest(
                    actions=[env_pb2.EpisodeAction(episode_id=i, action=t) for i, t in zip(ids, texts, strict=True)]
                )
                started = time.perf_counter()
                reply = await stub.Step(request)
                elapsed = time.perf_counter() - started
                assert len(reply.episodes) == len(ids)
                if round_index > 0:
                    step_time += elapsed
                    num_steps += len(ids)
                    latencies.append(elapsed * 1000)
            await stub.CloseEpisodes(env_pb2.CloseEpisodesRequest(episode_ids=ids))
            round_index += 1
    return num_steps / step_time, latencies


def _measure(label: str, fn: Callable[[], Any]) -> Any:
    _say(f"{label} ...")
    return fn()


def _grpc(args: argparse.Namespace, frame_cache: bool) -> tuple[float, list[float]]:
    with server_subprocess(_config(args, frame_cache)) as address:
        return asyncio.run(bench_grpc(args, address))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl bench env", description=summary(__doc__))
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--batch-size", type=int, default=256, help="episodes per Step call")
    parser.add_argument("--group-size", type=int, default=16, help="episodes per maze seed")
    parser.add_argument("--size", type=int, default=9, help="grid side (odd)")
    parser.add_argument("--unit-px", type=int, default=8, help="pixels per grid unit")
    parser.add_argument("--moves", type=int, default=20, help="steps per episode")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    args = parser.parse_args(argv)

    inproc = _measure("in-process steps, frame cache on", lambda: bench_inproc(args, frame_cache=True))
    _say(f"  {inproc:,.0f} steps/s")
    uncached = _measure("in-process steps, frame cache off", lambda: bench_inproc(args, frame_cache=False))
    _say(f"  {uncached:,.0f} steps/s")
    render_rate, png_bytes = _measure("render + PNG encode, no cache", lambda: bench_render(args))
    _say(f"  {render_rate:,.0f} frames/s, {png_bytes} bytes per frame")
    label = f"gRPC steps, batches of {args.batch_size}, server in a subprocess over loopback"
    grpc_rate, latencies = _measure(f"{label}, frame cache on", lambda: _grpc(args, frame_cache=True))
    _say(f"  {grpc_rate:,.0f} steps/s, batch p50 {statistics.median(latencies):.2f} ms, "
         f"{grpc_rate / inproc:.0%} of in-process")
    grpc_uncached, _ = _measure(f"{label}, frame cache off", lambda: _grpc(args, frame_cache=False))
    _say(f"  {grpc_uncached:,.0f} steps/s, {grpc_uncached / uncached:.0%} of in-process without cache")
    quantiles = statistics.quantiles(latencies, n=20)
    result = {
        "inproc_steps_per_s": round(inproc),
        "inproc_uncached_steps_per_s": round(uncached),
        "render_encode_per_s": round(render_rate),
        "grpc_steps_per_s": round(grpc_rate),
        "grpc_vs_inproc": round(grpc_rate / inproc, 3),
        "grpc_uncached_steps_per_s": round(grpc_uncached),
        "grpc_uncached_vs_inproc_uncached": round(grpc_uncached / uncached, 3),
        "grpc_batch_p50_ms": round(statistics.median(latencies), 3),
        "grpc_batch_p95_ms": round(quantiles[18], 3),
        "grpc_server": "subprocess",
        "frame_cache": True,
        "frame_png_bytes": png_bytes,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "size": args.size,
        "unit_px": args.unit_px,
        "moves_per_episode": args.moves,
    }
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
