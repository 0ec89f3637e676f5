"""pytest's log capture against a thread that creates loggers (tests/conftest.py holds logging's lock)."""

from __future__ import annotations

import logging
import threading
import time

from _pytest.logging import LogCaptureHandler, catching_logs


def test_attaching_the_capture_handler_survives_a_thread_creating_loggers() -> None:
    done = threading.Event()

    def create_loggers() -> None:
        n = 0
        while not done.is_set():
            logging.getLogger(f"mmrl.test.race.{n}")
            n += 1
            time.sleep(0.0005)

    creator = threading.Thread(target=create_loggers, daemon=True)
    creator.start()
    failures = 0
    deadline = time.monotonic() + 1.5
    try:
        while time.monotonic() < deadline:
            try:
                with catching_logs(LogCaptureHandler()):
                    pass
            except RuntimeError:  # dictionary changed size during iteration
                failures += 1
    finally:
        done.set()
        creator.join()
    assert failures == 0
