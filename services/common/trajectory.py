"""The trajectory schema at a service edge: a frozen mirror of `mmrl.v1.Trajectory`.

Token arrays are flat over the whole multi-turn conversation; every per-token array has the same
length as `token_ids`. Images are the encoded frames in order of their placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # protobuf is needed only at the wire (the learner's GPU check runs without it)
    from mmrl_proto.v1 import common_pb2


@dataclass(frozen=True)
class Trajectory:
    trajectory_id: str
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    turn_starts: tuple[int, ...] = ()
    images: tuple[bytes, ...] = ()
    adapter_version: int = 0
    reward: float = 0.0
    group_id: str = ""
    segments: int = 1
    """How many trajectories the episode was cut into (a windowed conversation: one per turn)."""
    image_mime_type: str = field(default="image/png")

    def validate(self) -> None:
        """Raises ValueError naming the first inconsistency."""
        n = len(self.token_ids)
        if n == 0:
            raise ValueError(f"trajectory {self.trajectory_id!r}: token_ids is empty")
        for name in ("loss_mask", "logprobs", "advantages"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"trajectory {self.trajectory_id!r}: {name} has {len(getattr(self, name))} "
                    f"entries, token_ids has {n}"
                )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"trajectory {self.trajectory_id!r}: loss_mask must be 0 or 1")
        if self.segments < 1:
            raise ValueError(f"trajectory {self.trajectory_id!r}: segments must be >= 1, got {self.segments}")
        if any(not 0 <= s < n for s in self.turn_starts):
            raise ValueError(f"trajectory {self.trajectory_id!r}: turn_starts outside token_ids")

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_proto(self) -> common_pb2.Trajectory:
        from mmrl_proto.v1 import common_pb2

        return common_pb2.Trajectory(
            trajectory_id=self.trajectory_id,
            token_ids=self.token_ids,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            advantages=self.advantages,
            turn_starts=self.turn_starts,
            images=[common_pb2.Image(data=d, mime_type=self.image_mime_type) for d in self.images],
            adapter_version=self.adapter_version,
            reward=self.reward,
            group_id=self.group_id,
            segments=self.segments,
        )

    @classmethod
    def from_proto(cls, msg: common_pb2.Trajectory) -> Trajectory:
        return cls(
            trajectory_id=msg.trajectory_id,
            token_ids=tuple(msg.token_ids),
            loss_mask=tuple(msg.loss_mask),
            logprobs=tuple(msg.logprobs),
            advantages=tuple(msg.advantages),
            turn_starts=tuple(msg.turn_starts),
            images=tuple(img.data for img in msg.images),
            adapter_version=msg.adapter_version,
            reward=msg.reward,
            group_id=msg.group_id,
            segments=max(msg.segments, 1),
            image_mime_type=msg.images[0].mime_type if msg.images else "image/png",
        )
