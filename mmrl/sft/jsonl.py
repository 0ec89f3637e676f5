"""The SFT's expert conversations as a chat dataset other trainers read (`mmrl sft export`).

One JSON line per conversation, in the layout Hugging Face `datasets` loads with
`load_dataset("json", data_files=FILE)` and TRL's `SFTTrainer` takes for vision-language models:

    {"messages": [{"role": "system", "content": [{"type": "text", "text": "..."}]},
                  {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Moves left: 20."}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "down"}]}, ...],
     "images": ["images/sft-500000-00.png", ...],
     "id": "sft-500000", "trained_turns": [true, ...]}

`images` lists the conversation's frames (PNG files written next to the JSONL) in the order of the
`{"type": "image"}` parts. The conversations are the very token ids `mmrl sft` trains on, read back
as text: roles from the `<|im_start|>role` headers, a run of image placeholders as one image part.
`trained_turns` has one flag per assistant turn: false for a detour move (`perturb_prob`), which
`mmrl sft` plays but does not train on; a trainer that cannot mask single turns should drop such
conversations or set `perturb_prob: 0`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.common.conversation import ChatTokens
from services.common.trajectory import Trajectory

IMAGES_DIR = "images"


def chat_messages(trajectory: Trajectory, tokenizer: Any, chat: ChatTokens) -> tuple[list[dict[str, Any]], list[bool]]:
    """The trajectory's turns as chat messages, and per assistant turn whether it is trained on."""
    ids = list(trajectory.token_ids)
    starts = [i for i, token in enumerate(ids) if token == chat.im_start]
    messages: list[dict[str, Any]] = []
    trained: list[bool] = []
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(ids)
        body = ids[start + 1 : end]
        header_len = next(k for k in range(1, len(body) + 1) if "\n" in tokenizer.decode(body[:k]))
        role = tokenizer.decode(body[:header_len]).split("\n")[0].strip()
        content: list[dict[str, Any]] = []
        text: list[int] = []
        in_image = False
        for token in body[header_len:]:
            if token == chat.vision_start:
                in_image = True
                if text:
                    content.append({"type": "text", "text": tokenizer.decode(text)})
                    text = []
                content.append({"type": "image"})
            elif token == chat.vision_end:
                in_image = False
            elif token == chat.im_end:
                break
            elif not in_image:
                text.append(token)
        if text:
            content.append({"type": "text", "text": tokenizer.decode(text)})
        messages.append({"role": role, "content": content})
        if role == "assistant":
            trained.append(any(trajectory.loss_mask[start:end]))
    return messages, trained


def write_jsonl(trajectories: Sequence[Trajectory], tokenizer: Any, out: Path) -> dict[str, Any]:
    """Writes `out` (JSONL) and its frames under `out.parent / images`; returns counts."""
    chat = ChatTokens.from_tokenizer(tokenizer)
    out = Path(out)
    (out.parent / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    num_images = 0
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "w") as handle:
        for trajectory in trajectories:
            messages, trained = chat_messages(trajectory, tokenizer, chat)
            images = []
            for k, frame in enumerate(trajectory.images):
                name = f"{IMAGES_DIR}/{trajectory.trajectory_id}-{k:02d}.png"
                (out.parent / name).write_bytes(frame)
                images.append(name)
            parts = sum(part["type"] == "image" for m in messages for part in m["content"])
            assert parts == len(images), f"{trajectory.trajectory_id}: {parts} image parts, {len(images)} frames"
            num_images += len(images)
            row = {"id": trajectory.trajectory_id, "messages": messages, "images": images, "trained_turns": trained}
            handle.write(json.dumps(row) + "\n")
    tmp.replace(out)
    return {"out": str(out), "conversations": len(trajectories), "images": num_images}
