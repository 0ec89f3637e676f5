"""The console in a real headless browser (Debian's chromium driven by playwright) against a real
coordinator process and Redis holding a finished tiny run (tests/coordinator/finished_run.py):
the run list, the curves, an episode's frames and keyboard stepping, the comparison of two eval
steps and the API docs, with no request leaving the machine; then the run queue, reordered and
cut short from the page.

Screenshots go to $MMRL_SCREENSHOTS_DIR when it is set (docs/images for the docs), else to the
test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.common.procs import free_port, stop_process
from services.coordinator.ops.store import RunStore
from tests.coordinator.coordinator_process import serve_coordinator
from tests.coordinator.finished_run import record_with_env_server

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "browser-token"
POOL = f"127.0.0.1:{free_port()}"  # the coordinator's one learner pool (nothing listens there)
ROOT = Path(__file__).resolve().parents[2]
ALL_FRAMES_LOADED = """() => {
  const images = [...document.querySelectorAll('.turns img')];
  return images.length > 0 && images.every((i) => i.complete && i.naturalWidth > 0);
}"""


@pytest.fixture(scope="module")
def coordinator(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The URL of a real coordinator process and of its Redis, which holds a finished run."""
    shared_root = tmp_path_factory.mktemp("shared")
    url = f"{redis_url}/4"
    asyncio.run(record_with_env_server(url, shared_root))
    port = free_port()
    env = {**os.environ, "MMRL_REDIS_URL": url, "MMRL_SHARED_ROOT": str(shared_root), "MMRL_API_TOKEN": TOKEN,
           "MMRL_RESUME_RUNS": "false", "MMRL_LEARNER_ADDRS": POOL, "MMRL_ALLOWED_MODELS": "some/model"}
    proc = serve_coordinator(env, port)
    base = f"http://127.0.0.1:{port}"
    yield base, url
    stop_process(proc)


@pytest.fixture
def browser_page(coordinator: tuple[str, str]) -> Iterator[tuple[Any, list[str]]]:
    """A chromium page; requests to any other host are refused and listed."""
    base = coordinator[0]
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]'")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: run scripts/install-system-deps.sh")
    outside: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})

        def local_only(route: Any) -> None:
            if route.request.url.startswith(base) or route.request.url.startswith(("blob:", "data:")):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        page.route("**/*", local_only)
        page.set_default_timeout(15_000)
        yield page, outside
        browser.close()


async def _add_step_event(redis_url: str) -> None:
    store = RunStore.from_url(redis_url)
    try:
        await store.add_event("console-tiny", "step", {"step": 4, "reward/mean": 1.0, "train/solve_rate": 1.0})
    finally:
        await store.close()


def _screenshots() -> Path | None:
    return Path(os.environ["MMRL_SCREENSHOTS_DIR"]) if os.environ.get("MMRL_SCREENSHOTS_DIR") else None


def test_the_console_shows_the_run_its_curves_and_every_frame_of_an_episode(
        coordinator: tuple[str, str], browser_page: tuple[Any, list[str]], tmp_path: Path) -> None:
    (base, redis_url), (page, outside) = coordinator, browser_page
    shots = _screenshots() or tmp_path
    shots.mkdir(parents=True, exist_ok=True)

    # The token prompt, then the run list.
    page.goto(f"{base}/ui/")
    page.fill("#token-input", TOKEN)
    page.click("#token-form button")
    row = page.locator("table.runs tbody tr", has_text="console tiny")
    row.wait_for()
    assert "succeeded" in row.inner_text() and "3 / 3" in row.inner_text()
    page.screenshot(path=str(shots / "console-runs.png"))

    # The run: its curves are drawn from its metrics and evals.
    row.get_by_role("link", name="console tiny").click()
    page.wait_for_selector('path[data-series="reward"]')
    for series in ("reward", "train solve", "greedy", "sampled", "rollout", "train"):
        assert page.locator(f'path[data-series="{series}"]').count() == 1, series
    assert page.locator('path[data-series="greedy"]').get_attribute("d").count("L") == 1  # evals at 0 and 3
    assert page.locator("h2", has_text="Adapter versions").is_visible()
    assert page.locator("text=adapters/v000003").is_visible()
    page.screenshot(path=str(shots / "console-run.png"), full_page=True)
    assert page.locator(".error").count() == 0

    # Live: while the run runs, a step event extends the curves without a reload.
    live = redis.Redis.from_url(redis_url, decode_responses=True)
    live.hset("mmrl:run:console-tiny", "state", "running")
    try:
        page.reload()
        page.wait_for_selector('path[data-series="reward"]')
        with ThreadPoolExecutor(1) as pool:  # playwright's sync API holds this thread's event loop
            pool.submit(asyncio.run, _add_step_event(redis_url)).result()
        page.wait_for_function("""() => document.querySelector('path[data-series="reward"]')
            .getAttribute('d').split('L').length === 4""")
    finally:
        live.hset("mmrl:run:console-tiny", "state", "succeeded")

    # Episodes of the last eval, then the first solved one: every turn's frame loads.
    page.goto(f"{base}/ui/#/runs/console-tiny/episodes?kind=eval&step=3&solved=true")
    page.wait_for_selector("table.episodes tbody tr")
    page.screenshot(path=str(shots / "console-episodes.png"))
    page.locator("table.episodes tbody tr a").first.click()
    page.wait_for_selector("#turn-title")
    page.wait_for_function(ALL_FRAMES_LOADED)
    turns = page.locator(".turns .turn").count()
    title = page.locator("#turn-title")
    assert title.inner_text() == f"Turn 1 of {turns - 1}"
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert title.inner_text() == f"Turn 3 of {turns - 1}"
    assert page.locator(".turn.current").get_attribute("data-turn") == "2"
    assert "Log-prob per token" in page.locator(".detail").inner_text()
    page.keyboard.press("ArrowLeft")
    assert title.inner_text() == f"Turn 2 of {turns - 1}"
    page.screenshot(path=str(shots / "console-episode.png"), full_page=True)
    page.keyboard.press("End")
    assert title.inner_text() == f"End (after {turns - 1} turns)"
    assert page.evaluate("document.querySelector('.frame.big').naturalWidth") > 0

    # One eval task at steps 0 and 3, side by side.
    page.goto(f"{base}/ui/#/runs/console-tiny/compare")
    page.wait_for_selector(".compare .column h2")
    page.wait_for_function(ALL_FRAMES_LOADED)
    assert page.locator(".compare .column h2").all_inner_texts() == ["Step 0", "Step 3"]
    page.screenshot(path=str(shots / "console-compare.png"), full_page=True)

    # The API docs render from the coordinator's own files.
    page.goto(f"{base}/docs")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "MMRL coordinator" in page.locator(".swagger-ui .info .title").inner_text()
    assert outside == []


def test_the_console_shows_the_queue_in_order_and_reorders_and_removes_its_runs(
        coordinator: tuple[str, str], browser_page: tuple[Any, list[str]], tmp_path: Path) -> None:
    (base, redis_url), (page, outside) = coordinator, browser_page
    r = redis.Redis.from_url(redis_url, decode_responses=True)  # another coordinator's run holds the pool
    r.hset("mmrl:run:holder", mapping={"id": "holder", "name": "holder", "state": "running", "config": "{}", "step": 1,
                                       "steps": 9, "created_at": 1, "updated_at": 1, "learner": POOL})
    r.set(f"mmrl:learner:{POOL}", "holder")
    r.set("mmrl:run:holder:lease", "elsewhere", px=120_000)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    ids = [httpx.post(f"{base}/v1/runs", headers=headers, timeout=10,
                      json={"config": {"name": name, "model": "some/model", "steps": 1}}).json()["id"]
           for name in ("first-in", "second-in")]
    try:
        page.goto(f"{base}/ui/")
        page.fill("#token-input", TOKEN)
        page.click("#token-form button")
        rows = page.locator("table.queue tbody tr")
        rows.first.wait_for()
        assert [rows.nth(i).get_attribute("data-run") for i in range(rows.count())] == ids
        assert "#2 in the queue" in page.locator("table.runs tbody tr", has_text="second-in").inner_text()
        (_screenshots() or tmp_path).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str((_screenshots() or tmp_path) / "console-queue.png"))

        rows.nth(1).get_by_title("Raise its priority").click()  # second-in: priority 1, so first
        page.wait_for_function(f"""() => document.querySelector('table.queue tbody tr')
            .getAttribute('data-run') === {ids[1]!r}""")
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator(f'table.queue tr[data-run="{ids[0]}"]').get_by_role("button", name="Remove").click()
        page.wait_for_function("() => document.querySelectorAll('table.queue tbody tr').length === 1")
        assert httpx.get(f"{base}/v1/runs/{ids[0]}", headers=headers, timeout=10).json()["state"] == "stopped"
        assert page.locator(".error").count() == 0 and outside == []
    finally:
        for run_id in ids:
            httpx.post(f"{base}/v1/runs/{run_id}/stop", headers=headers, timeout=10)
        r.hset("mmrl:run:holder", "state", "succeeded")
