"""The routes the console reads, against a real Redis holding a recorded run with frames on disk:
frames (auth, 404, no path outside the run's directory), episode records, training-frame sampling,
adapter versions, config files, and API docs that load nothing from another host."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.common.procs import free_port
from services.coordinator.api.app import create_app
from services.coordinator.api.console import UI_DIR
from services.coordinator.config import CoordinatorSettings, FrameSettings
from services.coordinator.grpo.episodes import PlayPlan, Policy, Prompting, Sampling, Timers, play_episodes
from services.coordinator.grpo.records import train_records
from services.coordinator.ops.replicas import Rollouts, Services
from services.coordinator.ops.wire import TaskSpec
from tests.coordinator.chat import CHAT, CharTokenizer
from tests.coordinator.finished_run import MAX_MOVES, ScriptedPolicy, record_with_env_server

TOKEN = "console-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def recorded(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(Redis URL, shared root) of a finished 3-step run recorded once for the module."""
    shared_root = tmp_path_factory.mktemp("shared")
    url = f"{redis_url}/3"
    asyncio.run(record_with_env_server(url, shared_root))
    return url, shared_root


@pytest.fixture
def client(recorded: tuple[str, Path]) -> Iterator[TestClient]:
    url, shared_root = recorded
    dead = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    settings = CoordinatorSettings(redis_url=url, api_token=TOKEN, shared_root=shared_root, env_addr=dead[0],
                                   rollout_addrs=dead[1], learner_addrs=dead[2], resume_runs=False)
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield test_client


def _episodes(client: TestClient, **params: object) -> list[dict]:
    reply = client.get("/v1/runs/console-tiny/episodes", params=params)
    assert reply.status_code == 200, reply.text
    return reply.json()["episodes"]


def test_a_frame_is_served_as_the_png_the_run_wrote_and_only_with_the_token(
        client: TestClient, recorded: tuple[str, Path]) -> None:
    episode = _episodes(client, kind="eval", step=3)[0]
    assert len(episode["frames"]) == len(episode["actions"]) + 1
    run_dir = recorded[1] / "runs" / "console-tiny"
    for index, frame in enumerate(episode["frames"]):
        assert not Path(frame).is_absolute()
        reply = client.get(f"/v1/runs/console-tiny/episodes/{episode['id']}/frames/{index}")
        assert reply.status_code == 200 and reply.headers["content-type"] == "image/png"
        assert reply.content == (run_dir / frame).read_bytes() and reply.content.startswith(b"\x89PNG")
    path = f"/v1/runs/console-tiny/episodes/{episode['id']}/frames/0"
    assert client.get(path, headers={"Authorization": ""}).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_frames_that_were_not_kept_or_do_not_exist_are_404(client: TestClient) -> None:
    eval_episode = _episodes(client, kind="eval", step=0)[0]
    unkept = [e for e in _episodes(client, kind="train", step=1) if e["group"] == 1][0]
    assert unkept["frames"] == []
    for path in (f"/v1/runs/nope/episodes/{eval_episode['id']}/frames/0",
                 "/v1/runs/console-tiny/episodes/nope/frames/0",
                 f"/v1/runs/console-tiny/episodes/{eval_episode['id']}/frames/{len(eval_episode['frames'])}",
                 f"/v1/runs/console-tiny/episodes/{eval_episode['id']}/frames/-1",
                 f"/v1/runs/console-tiny/episodes/{unkept['id']}/frames/0"):
        assert client.get(path).status_code == 404, path


def test_no_path_outside_the_run_directory_can_be_read_whatever_the_record_or_url_says(
        client: TestClient, recorded: tuple[str, Path]) -> None:
    url, shared_root = recorded
    run_dir = shared_root / "runs" / "console-tiny"
    secret = shared_root / "secret.png"
    secret.write_bytes(b"\x89PNG secret")
    other = shared_root / "runs" / "console-tiny-other" / "x.png"  # a sibling whose name extends the run's
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_bytes(b"\x89PNG other")
    link = run_dir / "episodes" / "link.png"
    link.symlink_to(secret)
    hostile = ["../secret.png", "../../secret.png", str(secret), "episodes/../../console-tiny-other/x.png",
               str(other), "episodes/link.png", "/etc/passwd", "", "episodes"]
    record = {"id": "hostile", "step": 99, "kind": "eval", "seed": 0, "frames": hostile}
    redis.Redis.from_url(url).hset("mmrl:run:console-tiny:episodes", "hostile", json.dumps(record))
    try:
        for index in range(len(hostile)):
            reply = client.get(f"/v1/runs/console-tiny/episodes/hostile/frames/{index}")
            assert reply.status_code == 404, hostile[index]
            assert b"secret" not in reply.content and b"other" not in reply.content
        for path in ("/v1/runs/..%2F..%2Fsecret.png/episodes/hostile/frames/0",
                     "/v1/runs/console-tiny/episodes/..%2F..%2Fsecret.png/frames/0",
                     "/v1/runs/console-tiny/episodes/hostile/frames/..%2F0",
                     "/v1/runs/console-tiny/../../secret.png"):
            reply = client.get(path)
            assert reply.status_code in (404, 422), path
            assert b"secret" not in reply.content
    finally:
        redis.Redis.from_url(url).hdel("mmrl:run:console-tiny:episodes", "hostile")
        link.unlink()


def test_episode_records_hold_each_actions_log_probs_and_how_the_episode_ended(client: TestClient) -> None:
    episodes = _episodes(client)
    assert {e["end"] for e in episodes} >= {"solved", "truncated"}
    for e in episodes:
        assert len(e["logprobs"]) == len(e["actions"]) == len(e["invalid_turns"])
        # One log-prob per generated token: the action's characters and the end-of-turn token.
        assert [len(lp) for lp in e["logprobs"]] == [len(a) + 1 for a in e["actions"]]
        assert all(v < 0 for lp in e["logprobs"] for v in lp)
        assert e["end"] == "solved" if e["solved"] else e["moves"] == MAX_MOVES and e["end"] == "truncated"
    assert any(any(e["invalid_turns"]) for e in episodes)
    solved = _episodes(client, solved="true")
    assert solved and all(e["solved"] for e in solved) and len(solved) == sum(e["solved"] for e in episodes)
    assert {e["seed"] for e in _episodes(client, seed=21)} == {21}
    assert {e["step"] for e in _episodes(client, seed=21)} == {0, 3}


def test_steps_report_the_bytes_of_the_training_frames_they_kept(
        client: TestClient, recorded: tuple[str, Path]) -> None:
    run_dir = recorded[1] / "runs" / "console-tiny"
    for metrics in client.get("/v1/runs/console-tiny/metrics").json()["metrics"]:
        step_dir = run_dir / "episodes" / f"train_step_{metrics['step']:06d}"
        on_disk = sum(p.stat().st_size for p in step_dir.rglob("*.png"))
        assert metrics["episodes/frames_bytes"] == on_disk > 0
        kept = [e for e in _episodes(client, kind="train", step=metrics["step"]) if e["frames"]]
        assert {e["group"] for e in kept} == {0} and len(kept) == 4  # train_groups: 1, of 4 episodes


async def test_training_frames_are_kept_for_none_the_first_groups_or_all_of_a_step(
        env_services: Services, tmp_path: Path) -> None:
    services = Services(env=env_services.env, rollouts=Rollouts([ScriptedPolicy([31, 32, 33])]),  # type: ignore[list-item]
                        learner=None)
    specs = [TaskSpec(seed=s, max_moves=4, options={"size": "9"}) for s in (31, 32, 33)]
    played = await play_episodes(services, Prompting(CharTokenizer(), CHAT, ""), Policy("r", 0), PlayPlan(
        specs, samples_per_spec=2, sampling=Sampling(1.0, 1.0, 8), max_turns=4, seed=1, keep_frames=True), Timers())
    groups = [played[0:2], played[2:4], played[4:6]]
    for step, (settings, groups_kept) in enumerate([(FrameSettings(train="off"), set()),
                                                    (FrameSettings(train="groups", train_groups=2), {0, 1}),
                                                    (FrameSettings(train="all"), {0, 1, 2})], start=1):
        records, written = train_records(groups, step=step, run_dir=tmp_path, settings=settings)
        assert len(records) == 6
        assert {r["group"] for r in records.values() if r["frames"]} == groups_kept
        files = sorted((tmp_path / "episodes" / f"train_step_{step:06d}").rglob("*.png"))
        assert written == sum(p.stat().st_size for p in files)
        assert len(files) == sum(len(r["frames"]) for r in records.values())
        assert all(len(r["frames"]) == len(r["actions"]) + 1 for r in records.values() if r["frames"])


def test_the_adapter_versions_of_a_run_are_listed(client: TestClient) -> None:
    adapters = client.get("/v1/runs/console-tiny/adapters").json()["adapters"]
    assert [a["version"] for a in adapters] == [1, 2, 3]
    assert adapters[0]["path"] == "adapters/v000001" and adapters[0]["bytes"] == 4096 + len('{"r": 8}')
    assert client.get("/v1/runs/nope/adapters").status_code == 404


def test_a_config_files_text_becomes_a_validated_run_config_or_a_422_saying_why(client: TestClient) -> None:
    text = (ROOT / "configs" / "maze-tiny-cpu.yaml").read_text()
    reply = client.post("/v1/configs/parse", json={"text": text})
    assert reply.status_code == 200, reply.text
    assert reply.json()["config"]["frames"] == {"train": "groups", "train_groups": 2}
    bad = client.post("/v1/configs/parse", json={"text": "model: m\ngrpo: {group_size: 1, bogus: 2}\n"})
    assert bad.status_code == 422
    assert {tuple(e["loc"]) for e in bad.json()["detail"]} == {("grpo", "group_size"), ("grpo", "bogus")}
    assert "not valid YAML" in client.post("/v1/configs/parse", json={"text": "a: [1"}).json()["detail"]
    assert client.post("/v1/configs/parse", json={"text": "model = 'm'", "format": "toml"}).status_code == 200
    assert client.post("/v1/configs/parse", json={"text": "model: m"}, headers={"Authorization": ""}).status_code == 401


_URL = re.compile(r"""(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s"'<>)]*""")


def test_the_docs_and_the_console_load_nothing_from_another_host(client: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        html = client.get(page, headers={"Authorization": ""}).text
        assert _URL.findall(html) == [], page
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert len(assets) >= 2, page
        for asset in assets:
            assert asset.startswith("/docs-assets/") and client.get(asset).status_code == 200, asset
    assert "MMRL coordinator" in client.get("/openapi.json").text
    reply = client.get("/ui/", headers={"Authorization": ""})
    assert reply.status_code == 200 and "console.js" in reply.text
    for path in sorted(UI_DIR.iterdir()):
        found = set(_URL.findall(path.read_text())) - {"http://www.w3.org/2000/svg"}  # a namespace, not a fetch
        assert found == set(), path.name
        assert client.get(f"/ui/{path.name}", headers={"Authorization": ""}).status_code == 200
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
