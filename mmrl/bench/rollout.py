"""`mmrl bench rollout [--json]`: generation through vLLM in process and through the gRPC service,
with and without a LoRA adapter, and the adapter publish-to-usable latency.

Workload: `--num-prompts` (128) distinct one-image prompts (an 80x80 maze-like frame + instruction,
built as the coordinator builds them), `--max-tokens` (4) sampled tokens each, seeded so that every
measurement does the same work. Each measurement gets frames never seen before, so no cache
(multimodal preprocessing, encoder, prefix) makes a later measurement cheaper than an earlier one.
One engine serves everything; the model is the tiny Qwen3-VL (built on the fly) unless `--model`.

Measured (best of `--repeats` rounds, warm engine; the CPU is often shared, so the minimum is the
least disturbed estimate; medians are reported too, as *_median_s):
  direct_s         the batch through vLLM's AsyncLLM in this process (PIL images, token prompts)
  service_s        the same through RolloutService.Generate over loopback gRPC (PNG bytes, validation)
  overhead_ratio   service_s / direct_s (target <= 1.10)
  lora_slowdown    direct_s with a loaded LoRA adapter / direct_s without
  service_lora_slowdown   the same through the service
  tokens_per_s     generated tokens per second through the service
  *_cpu_s          median CPU seconds of the whole process tree (engine processes included) per
                   measurement, with overhead_ratio_cpu and lora_slowdown_cpu: the work done, which
                   other programs' load disturbs far less than wall time
  adapter_load_ms  publish a version directory (write, manifest, fsync, rename) -> LoadAdapter returned
                   (usable); adapter_load_rpc_ms is the service's own part (copy, verify, vLLM load)
Prints progress lines, then (with --json) one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mmrl.models.tiny_adapter import PROMPT_TEXT, frame_png, publish_adapter, train_adapter
from mmrl_proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from services.common import storage
from services.common.conversation import ChatTokens
from services.common.grpc_server import channel
from services.common.messages import summary
from services.rollout.config import RolloutConfig
from services.rollout.engine_vllm import VllmEngine
from services.rollout.service import RolloutServer

RUN = "bench"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Workload:
    """Fresh frames for every measurement, the compact prompt, and the two ways to send them."""

    def __init__(self, prompt: list[int], num_prompts: int, max_tokens: int) -> None:
        self.prompt = prompt
        self.num_prompts = num_prompts
        self.max_tokens = max_tokens
        self._next_seed = 0

    def frames(self) -> list[bytes]:
        start, self._next_seed = self._next_seed, self._next_seed + self.num_prompts
        return [frame_png(1000 + seed) for seed in range(start, start + self.num_prompts)]

    def proto(self, frames: list[bytes], version: int) -> rollout_pb2.GenerateRequest:
        return rollout_pb2.GenerateRequest(requests=[
            rollout_pb2.GenerationRequest(
                prompt_token_ids=self.prompt, images=[common_pb2.Image(data=frame, mime_type="image/png")],
                sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=self.max_tokens, seed=i),
                adapter_run_id=RUN if version else "", adapter_version=version)
            for i, frame in enumerate(frames)
        ])


def _tree_cpu_s() -> float:
    """User + system CPU seconds of this process and its children (the engine core and its worker)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # a helper that just exited
            continue
        total += times.user + times.system
    return total


class Measured:
    """Wall and CPU seconds of a block (CPU of the whole process tree: less disturbed by other load)."""

    def __enter__(self) -> Measured:
        self.cpu_s, self.wall_s = _tree_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.wall_s
        self.cpu_s = _tree_cpu_s() - self.cpu_s


async def _direct(llm: Any, workload: Workload, lora: Any) -> tuple[Measured, int]:
    """Seconds for the batch through AsyncLLM.generate (images decoded beforehand), generated tokens."""
    from PIL import Image
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    images = [Image.open(io.BytesIO(frame)).convert("RGB") for frame in workload.frames()]
    tag = os.urandom(4).hex()

    async def one(i: int, image: Any) -> int:
        params = SamplingParams(temperature=1.0, max_tokens=workload.max_tokens, seed=i, logprobs=0,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        prompt = {"prompt_token_ids": workload.prompt, "multi_modal_data": {"image": image}}
        async for output in llm.generate(prompt, params, request_id=f"direct-{tag}-{i}", lora_request=lora):
            final = output
        return len(final.outputs[0].token_ids)

    with Measured() as measured:
        counts = await asyncio.gather(*(one(i, image) for i, image in enumerate(images)))
    return measured, sum(counts)


async def _service(stub: rollout_pb2_grpc.RolloutServiceStub, workload: Workload,
                   version: int) -> tuple[Measured, int]:
    request = workload.proto(workload.frames(), version)
    with Measured() as measured:
        reply = await stub.Generate(request)
    assert all(r.adapter_version == version for r in reply.results)
    return measured, sum(len(r.completions[0].token_ids) for r in reply.results)


async def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    from vllm.lora.request import LoRARequest

    model_dir = args.model
    if model_dir is None:
        from mmrl.models.tiny import build_tiny_model

        _say("building the tiny model")
        model_dir = build_tiny_model(work_dir / "tiny-model")
    shared, cache = work_dir / "shared", work_dir / "cache"
    cache.mkdir(parents=True)
    _say("training a LoRA adapter (peft, a few AdamW steps)")
    publish_adapter(train_adapter(model_dir, [frame_png(s) for s in range(4)]), storage.adapter_dir(shared, RUN, 1))

    config = RolloutConfig(model=str(model_dir), max_model_len=2048, limit_images_per_prompt=4,
                           max_num_seqs=max(256, args.num_prompts), lora_kernels=args.lora_kernels,
                           engine_metrics=args.engine_metrics)
    server = await RolloutServer.start(config, "127.0.0.1:0", shared_root=shared, cache_dir=cache)
    start = time.perf_counter()
    await server.start_engine(VllmEngine.start)
    engine_start_s = time.perf_counter() - start
    _say(f"engine up in {engine_start_s:.1f} s (lora_kernels={args.lora_kernels})")
    assert isinstance(server.engine, VllmEngine)
    llm = server.engine.async_llm
    try:
        async with channel(f"127.0.0.1:{server.port}") as ch:
            stub = rollout_pb2_grpc.RolloutServiceStub(ch)
            await stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id=RUN, version=1))
            (loaded,) = server.adapters.loaded() if server.adapters else []
            lora = LoRARequest(loaded.ref.name, loaded.ref.lora_int_id, loaded.ref.path)
            tokenizer = llm.renderer.get_tokenizer()
            workload = Workload(ChatTokens.from_tokenizer(tokenizer).user_turn(tokenizer, PROMPT_TEXT, 1),
                                args.num_prompts, args.max_tokens)
            measurements: dict[str, list[Measured]] = {
                k: [] for k in ("direct", "service", "direct_lora", "service_lora")}
            tokens: list[int] = []
            for round_index in range(args.repeats + 1):  # round 0 warms every path up
                paths = {
                    "direct": lambda: _direct(llm, workload, None),
                    "service": lambda: _service(stub, workload, 0),
                    "direct_lora": lambda: _direct(llm, workload, lora),
                    "service_lora": lambda: _service(stub, workload, 1),
                }
                order = list(paths) if round_index % 2 == 0 else list(reversed(paths))  # no path always first
                results = {key: await paths[key]() for key in order}
                if round_index == 0:
                    continue
                for key, (measured, _) in results.items():
                    measurements[key].append(measured)
                tokens.append(results["service"][1])
                _say(f"round {round_index}: " + ", ".join(
                    f"{k} {results[k][0].wall_s:.3f} s ({results[k][0].cpu_s:.2f} cpu-s)" for k in paths))
            load_ms, rpc_ms = [], []
            for version in range(2, 2 + args.adapter_loads):
                start = time.perf_counter()
                storage.publish_adapter_copy(storage.adapter_dir(shared, RUN, 1), storage.adapter_dir(shared, RUN, version))
                reply = await stub.LoadAdapter(rollout_pb2.LoadAdapterRequest(run_id=RUN, version=version))
                load_ms.append((time.perf_counter() - start) * 1000)
                rpc_ms.append(reply.load_ms)
    finally:
        await server.close()
        await server.running.stop(grace_s=0)

    best = {k: min(m.wall_s for m in v) for k, v in measurements.items()}
    median = {k: statistics.median(m.wall_s for m in v) for k, v in measurements.items()}
    cpu = {k: statistics.median(m.cpu_s for m in v) for k, v in measurements.items()}
    return {
        "direct_s": round(best["direct"], 4),
        "service_s": round(best["service"], 4),
        "overhead_ratio": round(best["service"] / best["direct"], 3),
        "adapter_load_ms": round(statistics.median(load_ms), 1),
        "adapter_load_rpc_ms": round(statistics.median(rpc_ms), 1),
        "tokens_per_s": round(statistics.median(tokens) / best["service"], 1),
        "lora_slowdown": round(best["direct_lora"] / best["direct"], 3),
        "direct_lora_s": round(best["direct_lora"], 4),
        "service_lora_s": round(best["service_lora"], 4),
        "service_lora_slowdown": round(best["service_lora"] / best["service"], 3),
        **{f"{k}_median_s": round(v, 4) for k, v in median.items()},
        **{f"{k}_cpu_s": round(v, 3) for k, v in cpu.items()},
        "overhead_ratio_cpu": round(cpu["service"] / cpu["direct"], 3),
        "lora_slowdown_cpu": round(cpu["direct_lora"] / cpu["direct"], 3),
        "lora_kernels": args.lora_kernels,
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "generated_tokens": int(statistics.median(tokens)),
        "repeats": args.repeats,
        "engine_start_s": round(engine_start_s, 1),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl bench rollout", description=summary(__doc__))
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: build the tiny model)")
    parser.add_argument("--num-prompts", type=int, default=128, help="prompts in each measured batch")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens generated per prompt")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--adapter-loads", type=int, default=5, help="adapter versions published and loaded")
    parser.add_argument("--lora-kernels", choices=["grouped", "vllm"], default="grouped",
                        help="CPU LoRA ops: the service's grouped ops or vLLM's reference ops")
    parser.add_argument("--engine-metrics", action=argparse.BooleanOptionalAction, default=True,
                        help="vLLM's Prometheus metrics on (the service's default) or off")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mmrl-bench-rollout-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key:<24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
