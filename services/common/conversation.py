"""A multi-turn conversation kept as token ids (docs/architecture.md, "Multi-turn token contract").

Layout, in Qwen's chat format (every piece is tokenized on its own and concatenated, so the
boundaries between observation, template and generated tokens are exact):

    <|im_start|>system\\n{system}<|im_end|>\\n                                   (optional)
    <|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>{text}<|im_end|>\\n
    <|im_start|>assistant\\n{generated ... <|im_end|>}\\n
    <|im_start|>user\\n ... next observation ...

Two views are kept:
- the *compact* ids, one `<|image_pad|>` per image: what is sent to the rollout engine;
- the *record*: the engine-expanded ids it reports back, with a loss mask (1 on generated tokens
  only) and the engine's log-probs. The learner trains on exactly the record.

Each turn the engine's expanded prompt must extend the previous record unchanged; a mismatch
raises, because re-tokenised or re-expanded history silently breaks RL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.common.trajectory import Trajectory

# The system turn of maze conversations, shared by SFT data and GRPO runs (same prompt, same tokens).
DEFAULT_SYSTEM_PROMPT = (
    "You are a maze solving agent. The image shows a maze. Reach the goal. "
    "Reply with one move: up, down, left, right or stop."
)


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def convert_tokens_to_ids(self, token: str) -> int: ...


@dataclass(frozen=True)
class ChatTokens:
    """Token ids of the chat template pieces, read from the model's tokenizer."""

    im_start: int
    im_end: int
    vision_start: int
    image_pad: int
    vision_end: int
    newline: tuple[int, ...]
    user_header: tuple[int, ...]
    assistant_header: tuple[int, ...]
    system_header: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ChatTokens:
        def special(token: str) -> int:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id < 0:
                raise ValueError(f"tokenizer has no {token} token")
            return int(token_id)

        def text(s: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(s, add_special_tokens=False))

        im_start = special("<|im_start|>")
        return cls(
            im_start=im_start,
            im_end=special("<|im_end|>"),
            vision_start=special("<|vision_start|>"),
            image_pad=special("<|image_pad|>"),
            vision_end=special("<|vision_end|>"),
            newline=text("\n"),
            user_header=(im_start, *text("user\n")),
            assistant_header=(im_start, *text("assistant\n")),
            system_header=(im_start, *text("system\n")),
        )

    def user_turn(self, tokenizer: Tokenizer, text: str, num_images: int) -> list[int]:
        """A user turn with `num_images` compact image placeholders, ending with the assistant header."""
        ids = list(self.user_header)
        for _ in range(num_images):
            ids += [self.vision_start, self.image_pad, self.vision_end]
        ids += tokenizer.encode(text, add_special_tokens=False)
        ids += [self.im_end, *self.newline, *self.assistant_header]
        return ids

    def system_turn(self, tokenizer: Tokenizer, text: str) -> list[int]:
        return [*self.system_header, *tokenizer.encode(text, add_special_tokens=False),
                self.im_end, *self.newline]

    def closing(self, generated: list[int]) -> list[int]:
        """Template tokens that close an assistant turn after `generated` (not trained on)."""
        if generated and generated[-1] == self.im_end:
            return list(self.newline)
        return [self.im_end, *self.newline]


def expand_image_placeholders(compact: list[int], image_pad: int, tokens_per_image: list[int]) -> list[int]:
    """Replaces the i-th `image_pad` by `tokens_per_image[i]` copies (what the engine does)."""
    out: list[int] = []
    index = 0
    for token in compact:
        if token == image_pad:
            if index >= len(tokens_per_image):
                raise ValueError("more image placeholders than images")
            out += [image_pad] * tokens_per_image[index]
            index += 1
        else:
            out.append(token)
    if index != len(tokens_per_image):
        raise ValueError(f"{len(tokens_per_image)} images but {index} placeholders")
    return out


@dataclass
class TokenConversation:
    """One episode's conversation. Call `add_observation`, send `compact_ids` + `images` to the
    engine, then `add_generation` with what it returned; repeat."""

    chat: ChatTokens
    compact_ids: list[int] = field(default_factory=list)
    images: list[bytes] = field(default_factory=list)
    record_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)

    def add_system(self, tokenizer: Tokenizer, text: str) -> None:
        assert not self.compact_ids, "the system turn comes first"
        ids = self.chat.system_turn(tokenizer, text)
        self.compact_ids += ids

    def add_observation(self, tokenizer: Tokenizer, text: str, images: list[bytes]) -> None:
        ids = self.chat.user_turn(tokenizer, text, len(images))
        self.compact_ids += ids
        self.images += images

    def add_generation(
        self, expanded_prompt: list[int], generated: list[int], generated_logprobs: list[float],
        trainable: bool = True,
    ) -> None:
        """Records one turn: the engine's expanded prompt and the tokens it generated (loss mask 1
        unless `trainable` is False, e.g. a deliberate detour in SFT data)."""
        if len(generated) != len(generated_logprobs):
            raise ValueError("generated tokens and log-probs differ in length")
        if expanded_prompt[: len(self.record_ids)] != self.record_ids:
            raise ValueError("the engine's prompt does not extend the recorded conversation")
        new_prompt = expanded_prompt[len(self.record_ids):]
        self.turn_starts.append(len(self.record_ids))
        self.record_ids += new_prompt
        self.loss_mask += [0] * len(new_prompt)
        self.logprobs += [0.0] * len(new_prompt)
        self.record_ids += generated
        self.loss_mask += [int(trainable)] * len(generated)
        self.logprobs += list(generated_logprobs)
        closing = self.chat.closing(generated)
        self.record_ids += closing
        self.loss_mask += [0] * len(closing)
        self.logprobs += [0.0] * len(closing)
        self.compact_ids += list(generated) + closing

    @property
    def num_turns(self) -> int:
        return len(self.turn_starts)

    @property
    def num_recorded_images(self) -> int:
        """Images whose placeholders made it into the record (a last, unanswered observation did not)."""
        return sum(1 for t in self.record_ids if t == self.chat.vision_start)

    def to_trajectory(self, trajectory_id: str, advantages: Sequence[float], *, reward: float,
                      adapter_version: int = 0, group_id: str = "") -> Trajectory:
        """The record as a learner trajectory, with one advantage per record token. Its images are
        those whose placeholders are in the record: a last observation no turn answered is left out."""
        return Trajectory(
            trajectory_id=trajectory_id, token_ids=tuple(self.record_ids), loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs), advantages=tuple(advantages), turn_starts=tuple(self.turn_starts),
            images=tuple(self.images[: self.num_recorded_images]), adapter_version=adapter_version,
            reward=reward, group_id=group_id,
        )
