"""A real coordinator process (`mmrl serve coordinator`) for the tests that need one."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from services.common.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]


def serve_coordinator(env: dict[str, str], port: int, timeout_s: float = 120) -> subprocess.Popen[bytes]:
    """Starts `mmrl serve coordinator` on 127.0.0.1:`port` with `env` (in a session of its own, so a
    test can kill its whole process group) and waits until /readyz answers."""
    proc = subprocess.Popen([sys.executable, "-m", "mmrl.cli.main", "serve", "coordinator", "--host", "127.0.0.1",
                             "--port", str(port)], env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise AssertionError(f"the coordinator did not start within {timeout_s:.0f} s")
        time.sleep(0.2)
