"""`mmrl serve env` serves and stops on SIGTERM; `mmrl bench env --json` ends with a JSON line; no torch."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.bench import env as bench
from mmrl.bench.env import wait_for_port
from services.common.grpc_server import check_health

ROOT = Path(__file__).resolve().parents[2]
ENV_MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in (ROOT / "services" / "env").rglob("*.py")
)


def test_importing_the_env_service_imports_no_torch_or_vllm() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {ENV_MODULES!r}: importlib.import_module(name)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'transformers'))\n"
        "assert not heavy, heavy\n"
    )
    assert len(ENV_MODULES) >= 10
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_the_server_serves_and_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "mmrl.cli.main", "serve", "env", "--host", "127.0.0.1", "--port", "0"],
            cwd=ROOT, stderr=log_file, stdout=subprocess.DEVNULL,
        )
        try:
            port = wait_for_port(log_path, process)
            assert asyncio.run(check_health(f"127.0.0.1:{port}", "mmrl.v1.EnvService"))
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
    messages = [json.loads(line)["msg"] for line in log_path.read_text().splitlines()]
    assert "grpc server listening" in messages and "shutting down" in messages


def test_serve_env_help_lists_the_flags() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mmrl.cli.main", "serve", "env", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )
    assert "--port" in result.stdout and "--host" in result.stdout


def test_bench_prints_one_json_object_as_its_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--json", "--seconds", "0.2", "--batch-size", "32", "--group-size", "8", "--moves", "4"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    for key in ("inproc_steps_per_s", "inproc_uncached_steps_per_s", "render_encode_per_s", "grpc_steps_per_s",
                "grpc_batch_p50_ms", "frame_png_bytes"):
        assert result[key] > 0, key
    assert result["grpc_server"] == "subprocess" and result["frame_cache"] is True
    assert len(lines) > 1, "progress lines come first"


def test_bench_steps_use_the_unit_px_asked_for_and_take_batches_past_the_default_limit() -> None:
    """Both step measurements play frames at `--unit-px`, and the gRPC server takes a batch above
    the default max_batch of 4096, as the in-process one does."""
    import argparse

    args = argparse.Namespace(size=9, unit_px=16, batch_size=4100, group_size=100, moves=1, seconds=0.0)
    assert all(spec.options["unit_px"] == "16" for spec in bench._specs(args, 0))
    assert bench.bench_inproc(args, frame_cache=True) > 0
    steps_per_s, latencies = bench._grpc(args, frame_cache=True)  # INVALID_ARGUMENT before
    assert steps_per_s > 0 and len(latencies) == 1  # one measured round (round 0 warms up) of one move
