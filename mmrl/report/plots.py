"""Demo outputs: the learning curve (JSON + PNG) and a solved episode as an image strip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw


def learning_curve(evals: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """step -> eval solve rates and the GRPO seconds spent by then, and step -> mean training reward
    (of the groups trained on) and the solve rate of every episode played (None before it was kept)."""
    spent = grpo_seconds(evals, metrics)
    return {
        "eval": [
            {"step": e["step"], "grpo_s": spent.get(e["step"]), "greedy_solve_rate": e["greedy_solve_rate"],
             "sampled_solve_rate": e.get("sampled_solve_rate"), "sampled_pass_rate": e.get("sampled_pass_rate"),
             "mean_moves_over_optimal": e.get("mean_moves_over_optimal"),
             "greedy_invalid_fraction": e.get("greedy_invalid_fraction"),
             "greedy_noop_fraction": e.get("greedy_noop_fraction"),
             "greedy_failed_stuck": e.get("greedy_failed_stuck"),
             "greedy_failed_cycling": e.get("greedy_failed_cycling"), "adapter_version": e["adapter_version"]}
            for e in evals
        ],
        "train": [
            {"step": m["step"], "reward_mean": m["reward/mean"], "step_s": m.get("time/step_s"),
             "played_solve_rate": m.get("episodes/played_solve_rate"),
             "groups_informative": m.get("groups/num_informative"), "groups_dropped": m.get("groups/num_dropped")}
            for m in metrics
        ],
    }


def grpo_seconds(evals: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> dict[int, float]:
    """eval step -> seconds of GRPO spent when that eval ended: the time of every step up to it
    (`time/step_s`: sampling, training, publishing) plus the time of every eval up to it (`eval_s`).
    It counts the run's work, not the wall clock, so a pause or a restart from a checkpoint adds
    nothing. Empty when a record lacks its time (a run recorded before the times were kept)."""
    timed = [(int(r["step"]), float(r[key])) for records, key in ((metrics, "time/step_s"), (evals, "eval_s"))
             for r in records if r.get(key) is not None]
    if len(timed) < len(metrics) + len(evals):
        return {}
    return {int(e["step"]): sum(s for k, s in timed if k <= int(e["step"])) for e in evals}


def last_eval_within(curve: dict[str, Any], budget_s: float) -> dict[str, Any] | None:
    """The last eval of the curve that ended within `budget_s` seconds of GRPO (None if none did, or
    if the curve has no times)."""
    within = [e for e in curve["eval"] if e.get("grpo_s") is not None and e["grpo_s"] <= budget_s]
    return within[-1] if within else None


def plot_curve(curve: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    steps = [e["step"] for e in curve["eval"]]
    ax.plot(steps, [e["greedy_solve_rate"] for e in curve["eval"]], "o-", label="eval solve rate (greedy)")
    sampled = [(e["step"], e["sampled_solve_rate"]) for e in curve["eval"] if e["sampled_solve_rate"] is not None]
    if sampled:
        ax.plot(*zip(*sampled, strict=True), "s--", label="eval solve rate (sampled)")
    if curve["train"]:
        ax.plot([m["step"] for m in curve["train"]], [m["reward_mean"] for m in curve["train"]],
                alpha=0.5, label="train mean reward")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def episode_strip(frames: list[Path], actions: list[str], path: Path, scale: int = 3) -> None:
    """Frames side by side (turn 0 = start), each labelled with the action taken from it."""
    images = [Image.open(f).convert("RGB") for f in frames]
    width, height = images[0].width * scale, images[0].height * scale
    label_h = 18
    strip = Image.new("RGB", (width * len(images), height + label_h), "white")
    draw = ImageDraw.Draw(strip)
    for i, image in enumerate(images):
        strip.paste(image.resize((width, height), Image.Resampling.NEAREST), (i * width, 0))
        label = f"{i}: {actions[i].strip()[:10]}" if i < len(actions) else f"{i}: goal"
        draw.text((i * width + 4, height + 3), label, fill="black")
    strip.save(path)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2))
