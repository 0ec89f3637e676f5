"""The watched inbox with a real coordinator app and a real Redis: a dropped config starts one run,
a bad one is rejected with its reason, and files survive a coordinator restart without starting twice."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
import yaml
from fastapi.testclient import TestClient

from services.coordinator.api.app import create_app
from tests.coordinator.triggers_support import TOKEN, run_config, settings, trigger_settings, wait_for


@pytest.fixture
def shared(redis_url: str, tmp_path: Path) -> Path:
    redis.Redis.from_url(f"{redis_url}/3").flushdb()
    return tmp_path / "shared"


@contextmanager
def coordinator(redis_url: str, shared: Path, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(settings(redis_url, shared), trigger_settings=trigger_settings([], tmp_path, inbox_poll_s=0.1))
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


def drop(directory: Path, name: str, config: dict[str, object]) -> Path:
    """Writes under a temporary name, then renames (what docs/triggers.md asks of a writer)."""
    directory.mkdir(parents=True, exist_ok=True)
    part = directory / f"{name}.part"
    part.write_text(yaml.safe_dump(config))
    os.utime(part, (time.time() - 5, time.time() - 5))  # settled
    return part.rename(directory / name)


def _runs(client: TestClient) -> list[dict]:
    return client.get("/v1/runs").json()["runs"]  # type: ignore[no-any-return]


def test_a_config_dropped_into_the_inbox_starts_one_run_and_moves_to_started(
        redis_url: str, shared: Path, tmp_path: Path) -> None:
    with coordinator(redis_url, shared, tmp_path) as client:
        drop(shared / "inbox", "nightly.yaml", run_config("nightly"))
        wait_for(client, "/v1/runs", lambda r: len(r["runs"]) == 1)
        assert wait_for_file(shared / "inbox" / "started" / "nightly.yaml")
        [run] = _runs(client)
        assert run["name"] == "nightly" and run["trigger"]["source"] == "inbox"
        assert run["trigger"]["key"] == "nightly.yaml" and run["trigger"]["rule"] == "inbox"
        assert [r["id"] for r in client.get("/v1/runs", params={"trigger_source": "inbox"}).json()["runs"]] == [run["id"]]
        time.sleep(0.5)  # more scans find nothing new
        assert len(_runs(client)) == 1 and list((shared / "inbox").glob("*.yaml")) == []


def test_a_file_dropped_while_its_learner_runs_another_run_queues_its_run_and_moves_to_started(
        redis_url: str, shared: Path, tmp_path: Path, tiny_model_dir: Path, held_runs: threading.Event) -> None:
    busy = run_config("first", model=str(tiny_model_dir))
    with coordinator(redis_url, shared, tmp_path) as client:
        drop(shared / "inbox", "first.yaml", busy)
        [first] = wait_for(client, "/v1/runs", lambda r: [x for x in r["runs"] if x["state"] == "running"])["runs"]
        drop(shared / "inbox", "second.yaml", {**busy, "name": "second"})  # the same learner
        assert wait_for_file(shared / "inbox" / "started" / "second.yaml")
        [second] = client.get("/v1/runs", params={"state": "queued"}).json()["runs"]
        assert (second["name"], second["queue_position"]) == ("second", 1)
        assert not (shared / "inbox" / "rejected").exists() or not list((shared / "inbox" / "rejected").iterdir())
        held_runs.set()
        wait_for(client, f"/v1/runs/{second['id']}", lambda r: r["state"] == "succeeded")
        assert client.get(f"/v1/runs/{first['id']}").json()["state"] == "succeeded"


def test_a_bad_inbox_file_moves_to_rejected_beside_its_reason_and_starts_nothing(
        redis_url: str, shared: Path, tmp_path: Path) -> None:
    with coordinator(redis_url, shared, tmp_path) as client:
        drop(shared / "inbox", "broken.yaml", run_config("broken", grpo={"group_size": 1}))
        drop(shared / "inbox", "notes.txt", {"a": 1})
        reason = wait_for_file(shared / "inbox" / "rejected" / "broken.yaml.reason.txt")
        assert "grpo.group_size" in reason.read_text()
        assert "not a run config file" in wait_for_file(shared / "inbox" / "rejected" / "notes.txt.reason.txt").read_text()
        assert (shared / "inbox" / "rejected" / "broken.yaml").exists()
        assert _runs(client) == []
        rejected = client.get("/v1/triggers/events", params={"source": "inbox", "outcome": "rejected"}).json()
        assert {e["event"]["key"] for e in rejected["events"]} == {"broken.yaml", "notes.txt"}


def test_inbox_files_survive_a_coordinator_restart_between_the_drop_and_the_start_and_start_once(
        redis_url: str, shared: Path, tmp_path: Path) -> None:
    inbox = shared / "inbox"
    with coordinator(redis_url, shared, tmp_path) as client:  # one file started; the coordinator then stops
        drop(inbox, "started-before.yaml", run_config("before"))
        started = wait_for_file(inbox / "started" / "started-before.yaml")
        wait_for(client, "/v1/runs", lambda r: len(r["runs"]) == 1)
    # While it is down: a file is dropped; one lies in processing/ (claimed, not started: the
    # coordinator died in between); and the started one is back in processing/, as if the
    # coordinator died after starting its run but before moving it (a rename keeps its mtime).
    drop(inbox, "dropped-while-down.yaml", run_config("while-down"))
    drop(inbox / "processing", "claimed-not-started.yaml", run_config("claimed"))
    started.rename(inbox / "processing" / "started-before.yaml")

    with coordinator(redis_url, shared, tmp_path) as client:
        for name in ("dropped-while-down.yaml", "claimed-not-started.yaml", "started-before.yaml"):
            wait_for_file(inbox / "started" / name)
        time.sleep(0.5)
        runs = _runs(client)
        assert sorted(r["name"] for r in runs) == ["before", "claimed", "while-down"]  # each once
        assert list((inbox / "processing").iterdir()) == []
        duplicate = client.get("/v1/triggers/events", params={"outcome": "duplicate"}).json()["events"]
        assert [e["event"]["key"] for e in duplicate] == ["started-before.yaml"]

        # The same file dropped again later (a new modification time) is a new run.
        drop(inbox, "started-before.yaml", run_config("before"))
        wait_for_file(inbox / "started" / "started-before.1.yaml")
        wait_for(client, "/v1/runs", lambda r: len(r["runs"]) == 4)


def wait_for_file(path: Path, timeout_s: float = 20) -> Path:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared: {sorted(p.name for p in path.parent.glob('*'))}"
        time.sleep(0.05)
    return path
