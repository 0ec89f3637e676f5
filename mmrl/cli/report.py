"""Demo outputs: the learning curve (JSON + PNG) and a solved episode as an image strip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw


def learning_curve(evals: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """step -> eval solve rates, and step -> mean training reward."""
    return {
        "eval": [
            {"step": e["step"], "greedy_solve_rate": e["greedy_solve_rate"],
             "sampled_solve_rate": e.get("sampled_solve_rate"), "sampled_pass_rate": e.get("sampled_pass_rate"),
             "mean_moves_over_optimal": e.get("mean_moves_over_optimal"), "adapter_version": e["adapter_version"]}
            for e in evals
        ],
        "train": [
            {"step": m["step"], "reward_mean": m["reward/mean"], "step_s": m.get("time/step_s"),
             "groups_informative": m.get("groups/num_informative"), "groups_dropped": m.get("groups/num_dropped")}
            for m in metrics
        ],
    }


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
