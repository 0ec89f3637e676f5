"""Local helper processes: Redis runs in its own session, so a Ctrl-C in the terminal (SIGINT to the
foreground process group) reaches the CLI, which stops Redis last, and not Redis itself; a free port
for a server is one no outgoing connection can take first."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from services.common import procs
from services.common.procs import ephemeral_range, free_port, port_open, start_redis, stop_process


def test_redis_is_started_in_its_own_session_and_stopped() -> None:
    port = free_port()
    proc = start_redis(port)
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
        assert os.getpgid(proc.pid) != os.getpgid(0)
    finally:
        stop_process(proc)
    assert proc.returncode is not None and not port_open("127.0.0.1", port)


def test_a_free_port_lies_outside_the_ephemeral_range_and_can_be_bound() -> None:
    low, high = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high and port >= procs.LOWEST_PORT
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        # Every draw outside the range lands on the taken port: the kernel's pick is the answer.
        monkeypatch.setattr(procs, "ephemeral_range", lambda: (procs.LOWEST_PORT + 2000, 65535))
        draws: list[tuple[int, int]] = []

        def draw(first: int, last: int) -> int:
            draws.append((first, last))
            return port

        monkeypatch.setattr(procs._draw, "randint", draw)
        assert free_port(tries=5) != port
        assert draws == [(procs.LOWEST_PORT, procs.LOWEST_PORT + 1999)] * 5


@pytest.mark.parametrize("text, expected", [("32768\t60999\n", (32768, 60999)), ("1024 65535", (1024, 65535)),
                                             ("garbage", (32768, 60999))])
def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path, text: str, expected: tuple[int, int]) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert ephemeral_range(path) == expected
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
