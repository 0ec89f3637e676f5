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

A *windowed* conversation (`window=k`) shows the engine only the system turn, the last k answered
turns and the current observation: every turn starts a new prompt, and so a new record, a
*segment*. Each segment trains on its last turn's generated tokens only (the k context turns were
trained on in their own segments), so an episode of T turns is T trajectories; `window=0` makes
each decision depend on the current observation alone.
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


@dataclass(frozen=True)
class Segment:
    """One record the engine saw as a single prompt and continuation: the whole conversation, or
    one turn of a windowed one. `first_turn` is the episode's index of its first trained turn."""

    record_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turn_starts: tuple[int, ...]
    images: tuple[bytes, ...]
    first_turn: int


@dataclass
class TokenConversation:
    """One episode's conversation. Call `add_observation`, send `compact_ids` + `images` to the
    engine, then `add_generation` with what it returned; repeat. With `window` set, the prompt
    keeps the last `window` answered turns only (module docstring)."""

    chat: ChatTokens
    window: int | None = None
    compact_ids: list[int] = field(default_factory=list)
    images: list[bytes] = field(default_factory=list)
    record_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)
    # The current segment's fields above; the closed segments, the system turn's ids and, per
    # answered turn, its (observation ids, images, answer ids) for later windows.
    closed: list[Segment] = field(default_factory=list)
    system_ids: list[int] = field(default_factory=list)
    answered: list[tuple[list[int], list[bytes], list[int]]] = field(default_factory=list)
    _pending: tuple[list[int], list[bytes]] = field(default_factory=lambda: ([], []), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 0:
            raise ValueError(f"window must be >= 0 answered turns, got {self.window}")

    def add_system(self, tokenizer: Tokenizer, text: str) -> None:
        assert not self.compact_ids, "the system turn comes first"
        ids = self.chat.system_turn(tokenizer, text)
        self.compact_ids += ids
        self.system_ids = list(ids)

    def add_observation(self, tokenizer: Tokenizer, text: str, images: list[bytes]) -> None:
        if self.window is not None and self.turn_starts:
            self._start_segment()
        ids = self.chat.user_turn(tokenizer, text, len(images))
        self.compact_ids += ids
        self.images += images
        self._pending = (ids, list(images))

    def _start_segment(self) -> None:
        """Closes the current segment and opens the next prompt: system turn and the last `window`
        answered turns."""
        self.closed.append(self._segment())
        kept = self.answered[-self.window:] if self.window else []
        self.compact_ids = list(self.system_ids)
        self.images = []
        for observation, images, answer in kept:
            self.compact_ids += observation + answer
            self.images += images
        self.record_ids, self.loss_mask, self.logprobs, self.turn_starts = [], [], [], []

    def _segment(self) -> Segment:
        return Segment(tuple(self.record_ids), tuple(self.loss_mask), tuple(self.logprobs),
                       tuple(self.turn_starts), tuple(self.images[: self.num_recorded_images]),
                       first_turn=len(self.answered) - len(self.turn_starts))

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
        self.answered.append((*self._pending, list(generated) + closing))

    @property
    def num_turns(self) -> int:
        return len(self.answered)

    def segments(self) -> list[Segment]:
        """Every record the engine saw, in order: one for an unwindowed conversation, one per turn
        for a windowed one (a last observation no turn answered adds none)."""
        return [*self.closed, self._segment()] if self.turn_starts else list(self.closed)

    @property
    def num_recorded_images(self) -> int:
        """Images whose placeholders made it into the record (a last, unanswered observation did not)."""
        return sum(1 for t in self.record_ids if t == self.chat.vision_start)

    def to_trajectory(self, trajectory_id: str, advantages: Sequence[float], *, reward: float,
                      adapter_version: int = 0, group_id: str = "") -> Trajectory:
        """The record of an unwindowed conversation as a learner trajectory, with one advantage per
        record token. Its images are those whose placeholders are in the record: a last observation
        no turn answered is left out."""
        if self.closed:
            raise ValueError("a windowed conversation is several records: use to_trajectories")
        return segment_trajectory(self._segment(), trajectory_id, advantages, reward=reward,
                                  adapter_version=adapter_version, group_id=group_id)

    def to_trajectories(self, trajectory_id: str, advantages: Sequence[Sequence[float]], *, reward: float,
                        adapter_version: int = 0, group_id: str = "") -> list[Trajectory]:
        """One trajectory per segment (`advantages`: per segment, one per record token), ids
        `<trajectory_id>` for a single segment and `<trajectory_id>-t<turn>` for a windowed
        conversation's; every one records how many segments the episode has (the learner weighs
        them so that the episode counts once)."""
        segments = self.segments()
        if len(advantages) != len(segments):
            raise ValueError(f"{len(segments)} segments but {len(advantages)} advantage lists")
        return [segment_trajectory(seg, trajectory_id if self.window is None else f"{trajectory_id}-t{seg.first_turn}",
                                   adv, reward=reward, adapter_version=adapter_version, group_id=group_id,
                                   segments=len(segments))
                for seg, adv in zip(segments, advantages, strict=True)]


def segment_trajectory(segment: Segment, trajectory_id: str, advantages: Sequence[float], *, reward: float,
                       adapter_version: int = 0, group_id: str = "", segments: int = 1) -> Trajectory:
    """A segment as a learner trajectory, one of `segments` of its episode."""
    return Trajectory(
        trajectory_id=trajectory_id, token_ids=segment.record_ids, loss_mask=segment.loss_mask,
        logprobs=segment.logprobs, advantages=tuple(advantages), turn_starts=segment.turn_starts,
        images=segment.images, adapter_version=adapter_version, reward=reward, group_id=group_id,
        segments=segments,
    )
