"""Episode records (`records.py`): frames of observations with any number of images."""

from __future__ import annotations

from pathlib import Path

from services.common.conversation import TokenConversation
from services.coordinator.grpo.episodes import EpisodeResult
from services.coordinator.grpo.records import episode_record, write_frames
from services.coordinator.ops.wire import TaskSpec
from tests.coordinator.chat import CHAT


def test_frames_are_named_and_recorded_by_the_turn_they_belong_to(tmp_path: Path) -> None:
    # A text-only first observation, then two images, then one.
    episode = EpisodeResult(spec=TaskSpec(seed=1), group_index=0, conversation=TokenConversation(CHAT),
                            actions=["left", "right"], rewards=[0.0, 1.0],
                            frames=[b"a", b"bb", b"ccc"], frame_counts=[0, 2, 1])
    paths, written = write_frames(episode, tmp_path / "episodes" / "e0", tmp_path)
    assert paths == ["episodes/e0/turn_001_0.png", "episodes/e0/turn_001_1.png", "episodes/e0/turn_002.png"]
    assert written == 6 and (tmp_path / paths[1]).read_bytes() == b"bb"
    record = episode_record(episode, step=1, kind="eval", frames=paths)
    assert record["frame_turns"] == [1, 1, 2]
