"""Local helper processes: Redis runs in its own session, so a Ctrl-C in the terminal (SIGINT to the
foreground process group) reaches the CLI, which stops Redis last, and not Redis itself."""

from __future__ import annotations

import os

from services.common.procs import free_port, port_open, start_redis, stop_process


def test_redis_is_started_in_its_own_session_and_stopped() -> None:
    port = free_port()
    proc = start_redis(port)
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
        assert os.getpgid(proc.pid) != os.getpgid(0)
    finally:
        stop_process(proc)
    assert proc.returncode is not None and not port_open("127.0.0.1", port)
