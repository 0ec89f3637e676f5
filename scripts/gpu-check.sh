#!/usr/bin/env bash
# The learner on one GPU in a few minutes (mmrl/bench/gpu.py): a random Qwen3-VL-shaped
# model of about 3.2e9 parameters in bfloat16 over NCCL with FSDP2 and LoRA, step time, tokens/s, peak
# GPU memory, bf16-vs-fp32 log-probs, the sharded loader, vLLM when installed (engine, adapter load,
# tokens/s, sleep/wake, log-prob agreement). The learner parts need torch,
# transformers, peft, safetensors, numpy and pillow only. The last line of output is one JSON object.
# Exits 2 at once without CUDA. Extra flags go to the check (--help lists them); PYTHON picks the
# interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m mmrl.bench.gpu "$@"
