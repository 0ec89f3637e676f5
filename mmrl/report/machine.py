"""What machine a figure was measured on: every summary (SFT report, demo, sweep) records it.

Float sums differ between CPUs (kernels pick other instructions: AVX-512, AMX), so runs of the same
settings drift apart from machine to machine; torch's version and thread count change the same sums.
The commit names the code.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

# CPU flags that change which float kernels run (and so the sums' rounding).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "fma")


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def kernel_flags(cpuinfo: str) -> list[str]:
    """The KERNEL_FLAGS the first CPU of /proc/cpuinfo has."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in KERNEL_FLAGS if flag in present]
    return []


def commit(root: Path) -> str:
    """The checkout's commit, with `+dirty` when files differ from it; "unknown" outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def machine_info(root: Path | None = None) -> dict[str, Any]:
    """CPU model and count, kernel flags, torch's version and threads, Python, and the commit."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    info: dict[str, Any] = {"cpu": cpu_model(cpuinfo), "cpus": os.cpu_count(), "cpu_flags": kernel_flags(cpuinfo),
                            "python": platform.python_version()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    except ImportError:
        info.update(torch=None, torch_threads=None)
    info["commit"] = commit(root or Path(__file__).resolve().parents[2])
    return info


def describe(info: dict[str, Any]) -> str:
    """One line: '2-core AMD EPYC (avx2, fma), torch 2.13.0 x2 threads, commit abc1234'."""
    flags = ", ".join(info.get("cpu_flags") or []) or "no AVX"
    return (f"{info.get('cpus')}-core {info.get('cpu')} ({flags}), torch {info.get('torch')} x"
            f"{info.get('torch_threads')} threads, commit {info.get('commit')}")
