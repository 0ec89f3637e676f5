"""Memory figures of the learner benchmark: each rank's peak resident set size (read from /proc, so
the learner itself needs no instrumentation) and the shape of a random Qwen3-VL-architecture model
of a requested parameter count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# Text decoder layers of the benchmark's random model: its hidden size follows the parameter count.
RANDOM_MODEL_LAYERS = 8
HIDDEN_MULTIPLE = 64  # mmrl/models/tiny.py check_text_shape


@dataclass(frozen=True)
class RandomModelShape:
    hidden_size: int
    num_layers: int

    @property
    def approx_params(self) -> int:
        """Parameters of the text decoder (the tiny builder's shape: query and output projections
        h x h, key and value h x h/2, MLP 3 x h x 2h, so 9 h^2 per layer)."""
        return 9 * self.hidden_size**2 * self.num_layers


def random_model_shape(num_params: float, num_layers: int = RANDOM_MODEL_LAYERS) -> RandomModelShape:
    """The hidden size (a multiple of 64) whose text decoder of `num_layers` comes closest to
    `num_params`; ValueError below the smallest one."""
    if num_params < 9 * HIDDEN_MULTIPLE**2 * num_layers:
        raise ValueError(f"--random-model-params {num_params:g}: at least {9 * HIDDEN_MULTIPLE**2 * num_layers}")
    hidden = math.sqrt(num_params / (9 * num_layers))
    return RandomModelShape(max(HIDDEN_MULTIPLE, round(hidden / HIDDEN_MULTIPLE) * HIDDEN_MULTIPLE), num_layers)


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def return_large_frees_to_the_system(threshold_bytes: int = 1 << 20) -> bool:
    """Makes glibc serve every allocation of at least `threshold_bytes` with its own mapping, given
    back to the system when freed. By default glibc raises that threshold up to 32 MiB as large
    blocks are freed, so the block-sized tensors of FSDP's gathers land on its heap and stay there:
    measured on 2 CPU ranks of a 5e8-parameter model, 530 MiB more peak memory per rank and 700 MiB
    more held after each step. False where glibc is absent."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        return bool(ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, threshold_bytes))
    except (OSError, AttributeError):
        return False


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def learner_rank_pids(launcher_pid: int) -> list[int]:
    """The learner ranks started by `launcher_pid` (`mmrl serve learner`, itself the only rank, or
    torchrun, whose workers run in sessions of their own): the processes below it, or it, that run
    services.learner.main and are not torchrun."""
    parents: dict[int, int] = {}
    commands: dict[int, list[bytes]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = _parent(int(entry.name))
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
    family, grew = {launcher_pid}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in family} - family
        family |= below
        grew = bool(below)
    return sorted(
        pid for pid in family
        if b"services.learner.main" in commands.get(pid, []) and b"torch.distributed.run" not in commands.get(pid, [])
    )


def peak_rss_mb(pids: list[int]) -> list[float]:
    """Each process's peak resident set size so far (VmHWM), in MiB. It counts the pages of shared
    libraries a process touched (torch alone about 400 MiB), which ranks share physically."""
    return [round(_status_kb(pid, "VmHWM") / 1024, 1) for pid in pids]


def rss_mb(pids: list[int]) -> list[float]:
    """Each process's resident set size now (VmRSS), in MiB."""
    return [round(_status_kb(pid, "VmRSS") / 1024, 1) for pid in pids]


def reset_peak(pids: list[int]) -> bool:
    """Restarts each process's peak count from its current resident set (Linux: "5" to
    /proc/PID/clear_refs); False where that is not allowed."""
    try:
        for pid in pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PhasePeaks:
    """Each rank's peak resident memory per phase of a benchmark (the peak is reset between phases
    where the kernel allows it; otherwise each phase reports the peak so far)."""

    def __init__(self, launcher_pid: int | None) -> None:
        self.pids = learner_rank_pids(launcher_pid) if launcher_pid is not None else []
        self.by_phase: dict[str, list[float]] = {}
        reset_peak(self.pids)

    def close(self, phase: str) -> None:
        self.by_phase[phase] = peak_rss_mb(self.pids)
        reset_peak(self.pids)

    def overall(self) -> list[float]:
        peaks = list(self.by_phase.values())
        return [max(values) for values in zip(*peaks, strict=True)] if peaks else []
