"""A vLLM worker extension with both of the rollout service's patches: importing this module in the
worker process installs them (services/rollout/mrope.py, services/rollout/cpu_lora.py)."""

from __future__ import annotations

from services.rollout.cpu_lora import CpuLoraWorkerExtension
from services.rollout.mrope import MropeWorkerExtension


class MropeAndCpuLoraWorkerExtension(MropeWorkerExtension, CpuLoraWorkerExtension):
    """One-pass M-RoPE positions and grouped CPU LoRA ops."""
