"""The rollout half of `mmrl bench gpu` (mmrl/bench/gpu.py starts it as a process of its
own): the rollout service's engine and adapter registry on a model and a published adapter version.

    python -m mmrl.bench.gpu_vllm --model DIR --shared-root DIR --run RUN --out FILE.json

It starts `VllmEngine` on the model, loads version 1 of RUN through `AdapterRegistry` (verified copy,
then the adapter probe against the learner's log-probs: services/common/adapter_probe.py), times
one Generate of `--prompts` requests with the adapter (tokens per second), Sleep and WakeUp where
the platform has a sleep mode, and writes a JSON object with the figures and a few samples (prompt,
completion and vLLM's log-probs) for the learner side to score. The same code runs on the CPU
backend with the tiny model (the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NUM_SAMPLES = 8


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from services.rollout.adapters import AdapterRegistry, ProbePolicy
    from services.rollout.config import RolloutConfig
    from services.rollout.engine import EngineRequest, Sampling
    from services.rollout.engine_vllm import VllmEngine

    config = RolloutConfig(model=str(args.model), max_model_len=args.max_model_len, max_lora_rank=16, max_loras=2,
                           limit_images_per_prompt=1, gpu_memory_utilization=args.gpu_memory_utilization)
    start = time.perf_counter()
    engine = await VllmEngine.start(config)
    report: dict[str, Any] = {"engine_start_s": round(time.perf_counter() - start, 2), "dtype": engine.info.dtype}
    try:
        with tempfile.TemporaryDirectory(prefix="mmrl-gpu-check-adapters-") as cache:
            tolerance = config.resolved_probe_tolerance(engine.info.dtype)
            registry = AdapterRegistry(engine, Path(args.shared_root), Path(cache), retention=2, max_runs=1,
                                       max_rank=16, probe=ProbePolicy("required", tolerance, "gpu-check"))
            adapter, load_ms = await registry.load(args.run, 1)
            report["adapter_load_ms"] = round(load_ms, 1)  # copy, verify, load into the engine, probe
            result = adapter.probe
            assert result is not None  # probed: the registry requires a probe
            report["probe"] = {"gap": result.gap, "learner_effect": result.learner_effect,
                               "served_effect": result.served_effect, "tolerance": tolerance}

            rng = random.Random(0)
            requests = [EngineRequest([rng.randrange(10, 500) for _ in range(args.prompt_tokens)],
                                      Sampling(temperature=1.0, max_tokens=args.max_tokens, seed=i), adapter=adapter.ref)
                        for i in range(args.prompts)]
            await engine.generate(requests[:2])  # the adapter's first use on the device
            start = time.perf_counter()
            results = await engine.generate(requests)
            seconds = time.perf_counter() - start
            generated = sum(len(c.token_ids) for r in results for c in r.completions)
            report["generate"] = {"prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
                                  "generated_tokens": generated, "seconds": round(seconds, 3),
                                  "generated_tokens_per_s": round(generated / seconds, 1)}
            report["samples"] = [{"prompt": list(r.prompt_token_ids), "completion": list(r.completions[0].token_ids),
                                  "logprobs": list(r.completions[0].logprobs)} for r in results[:NUM_SAMPLES]]
            report["sleep"] = await sleep_and_wake(engine, requests[0])
            await registry.close()
    finally:
        await engine.shutdown()
    return report


async def sleep_and_wake(engine: Any, request: Any) -> dict[str, Any]:
    """Sleep (level 1) and WakeUp times, and a generation after the wake; skipped without a sleep mode."""
    if not engine.info.sleep_supported:
        return {"skipped": True, "reason": "the platform has no vLLM sleep mode (it needs a GPU)"}
    start = time.perf_counter()
    await engine.sleep(1)
    slept = time.perf_counter()
    await engine.wake_up()
    woke = time.perf_counter()
    (after,) = await engine.generate([request])
    return {"sleep_ms": round((slept - start) * 1000, 1), "wake_ms": round((woke - slept) * 1000, 1),
            "generates_after_wake": len(after.completions[0].token_ids) > 0}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmrl.bench.gpu_vllm", description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    parser.add_argument("--shared-root", type=Path, required=True, help="holds runs/RUN/adapters/v000001")
    parser.add_argument("--run", required=True, help="the run whose version 1 is loaded")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON object goes")
    parser.add_argument("--prompts", type=int, default=64, help="requests of the timed Generate")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt length of each request")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--max-model-len", type=int, default=2048, help="the engine's context length")
    parser.add_argument("--gpu-memory-utilization", type=float, help="the engine's share of GPU memory")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    args.out.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
