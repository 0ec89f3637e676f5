"""Starting and stopping local helper processes (Redis, services) for `mmrl up`, demos and tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
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
