"""Episode records: what Redis keeps of an episode (its actions, the per-token log-probs of each
action, reward, how it ended) and its frames on shared storage.

Frames are written as `<run dir>/episodes/<eval|train>_step_<NNNNNN>/<episode>/turn_<TTT>.png`
(the frame the agent saw before each action, then the one it ended on), and the record lists
them relative to the run directory, `<shared_root>/runs/<run_id>/`. Records written before frame
paths were relative list absolute paths; `frame_file` reads both and serves neither from outside
the run directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.common import storage
from services.coordinator.config import FrameSettings
from services.coordinator.grpo.episodes import EpisodeResult


def end_reason(episode: EpisodeResult) -> str:
    """How the episode ended, in the env contract's words: solved; terminated (the env ended the task
    unsolved: it ran its course, or the agent gave up or got stuck); truncated (the env's move budget
    ran out); turn_limit (the run's turn cap ended it before the env did)."""
    if episode.solved:
        return "solved"
    if episode.terminated:
        return "terminated"
    return "truncated" if episode.truncated else "turn_limit"


def action_logprobs(episode: EpisodeResult) -> list[list[float]]:
    """Per turn, the engine's log-prob of every token of the action it generated."""
    out = []
    for seg in episode.conversation.segments():
        bounds = [*seg.turn_starts, len(seg.record_ids)]
        out += [[lp for lp, mask in zip(seg.logprobs[start:end], seg.loss_mask[start:end], strict=True) if mask]
                for start, end in zip(bounds, bounds[1:], strict=False)]
    return out


def frame_turns(episode: EpisodeResult) -> list[int]:
    """For each kept frame, the observation it belongs to (turn t acted from observation t; the last
    one is where the episode ended): an observation may have any number of images, zero included."""
    return [t for t, count in enumerate(episode.frame_counts) for _ in range(count)]


def write_frames(episode: EpisodeResult, frame_dir: Path, run_dir: Path) -> tuple[list[str], int]:
    """Writes the episode's frames under `frame_dir` (`turn_TTT.png`, or `turn_TTT_K.png` where an
    observation has several images); returns their paths relative to `run_dir` and the bytes written."""
    frame_dir.mkdir(parents=True, exist_ok=True)
    paths, written = [], 0
    turns = frame_turns(episode)
    for index, (turn, data) in enumerate(zip(turns, episode.frames, strict=True)):
        single = episode.frame_counts[turn] == 1
        path = frame_dir / (f"turn_{turn:03d}.png" if single else f"turn_{turn:03d}_{index - turns.index(turn)}.png")
        path.write_bytes(data)
        paths.append(path.relative_to(run_dir).as_posix())
        written += len(data)
    return paths, written


def episode_record(episode: EpisodeResult, *, step: int, kind: str, frames: list[str] | None = None) -> dict[str, Any]:
    """The JSON record of an episode for Redis; `frames` are its frame files (relative to the run
    directory), if kept."""
    return {
        "id": episode.episode_id, "step": step, "kind": kind, "seed": episode.spec.seed,
        "group": episode.group_index, "reward": episode.reward, "solved": episode.solved,
        "moves": episode.info.get("moves"), "optimal_moves": episode.info.get("optimal_moves"),
        "actions": episode.actions, "adapter_version": episode.adapter_version,
        "num_tokens": sum(len(seg.record_ids) for seg in episode.conversation.segments()), "frames": frames or [],
        "frame_turns": frame_turns(episode) if frames else [],
        "logprobs": action_logprobs(episode), "invalid_turns": list(episode.invalid_turns),
        "end": end_reason(episode),
    }


def train_records(groups: list[list[EpisodeResult]], *, step: int, run_dir: Path,
                  settings: FrameSettings) -> tuple[dict[str, dict[str, Any]], int]:
    """The records of a step's training episodes, by episode id, writing the frames of the groups
    `settings` keeps; returns them with the bytes of frames written."""
    records: dict[str, dict[str, Any]] = {}
    written = 0
    step_dir = run_dir / "episodes" / f"train_step_{step:06d}"
    for g, group in enumerate(groups):
        keep = settings.train == "all" or (settings.train == "groups" and g < settings.train_groups)
        for k, episode in enumerate(group):
            frames: list[str] = []
            if keep and episode.frames:
                frames, size = write_frames(episode, step_dir / f"g{g:03d}_e{k:02d}", run_dir)
                written += size
            records[episode.episode_id] = episode_record(episode, step=step, kind="train", frames=frames)
    return records, written


def eval_records(greedy: list[EpisodeResult], *, step: int, run_dir: Path,
                 keep_frames: bool) -> tuple[dict[str, dict[str, Any]], int]:
    """The records of an eval's greedy episodes, as `eval-<step>-<task index>`, with their frames
    when `keep_frames`; returns them with the bytes of frames written."""
    records: dict[str, dict[str, Any]] = {}
    written = 0
    step_dir = run_dir / "episodes" / f"eval_step_{step:06d}"
    for i, episode in enumerate(greedy):
        frames: list[str] = []
        if keep_frames and episode.frames:
            frames, size = write_frames(episode, step_dir / f"{i:03d}", run_dir)
            written += size
        episode_id = f"eval-{step}-{i}"
        records[episode_id] = {**episode_record(episode, step=step, kind="eval", frames=frames), "id": episode_id}
    return records, written


def frame_file(shared_root: Path, run_id: str, record: dict[str, Any], index: int) -> Path | None:
    """The file of frame `index` of an episode record, or None: no such frame, no such file, or a
    path that resolves outside the run's directory (whatever the record says)."""
    try:
        root = storage.run_dir(shared_root, run_id)
    except ValueError:
        return None
    frames = record.get("frames") or []
    if not 0 <= index < len(frames) or not isinstance(frames[index], str):
        return None
    path = root / frames[index]  # an absolute path (older records) stays as it is
    if not storage.is_within(path, root) or not path.is_file():
        return None
    return path.resolve()
