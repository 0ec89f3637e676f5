"""Starting and stopping local helper processes (Redis, services) for `mmrl up`, demos and tests."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000  # below: ports that system services are configured to
_draw = random.Random()  # its own stream: the callers' seeded `random` is left as it was


def ephemeral_range(path: Path = EPHEMERAL_PORTS) -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections (Linux's default where it is not read)."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A port nothing listens on, for a server started next. It is drawn outside the ephemeral range:
    a port the kernel picked from that range could be taken, before the server binds it, by an
    outgoing connection of any process on the machine (the server would then fail to start)."""
    low, high = ephemeral_range()
    ranges = [r for r in ((LOWEST_PORT, low - 1), (high + 1, 65535)) if r[1] - r[0] >= 1000]
    for _ in range(tries if ranges else 0):
        first, last = _draw.choice(ranges)
        port = _draw.randint(first, last)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room outside the ephemeral range: the kernel's pick
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def start_redis(port: int, data_dir: Path | None = None, log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Starts a real `redis-server` on 127.0.0.1:`port` (append-only persistence when `data_dir`,
    fsynced on every write: a step recorded before a crash is on disk after it)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian package redis-server; `make setup`)")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        args += ["--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "always"]
    else:
        args += ["--appendonly", "no"]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    # Its own session: a Ctrl-C in the terminal reaches the CLI, which stops Redis last, not Redis
    # itself (redis-server shuts down on SIGINT, and a demo still reads the run's curve after Ctrl-C).
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_port("127.0.0.1", port, timeout_s=20, proc=proc, what="redis-server")
    return proc


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None,
                  what: str = "process") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on {port}")
        if port_open(host, port):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on {host}:{port} within {timeout_s:.0f} s")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
