"""`mmrl up`: the whole stack as local processes (Redis included), until Ctrl-C."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mmrl.cli.stack import Stack, StackConfig

DEFAULT_MODEL = Path(".mmrl/models/tiny")


def ensure_tiny_model(model: Path) -> Path:
    """`model`, after building the tiny model there when it is the default path and nothing is
    there yet (machines without weights). Any other path is used as given."""
    if model == DEFAULT_MODEL and not (model / "config.json").is_file():
        from mmrl.models.tiny import build_tiny_model

        print(f"building the tiny model at {model}", flush=True)
        build_tiny_model(model)
    return model


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl up", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="model directory served by rollout and trained by the learner "
                             "(the tiny model is built there if missing)")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl"), help="logs, Redis data, shared root")
    parser.add_argument("--port", type=int, default=8000, help="coordinator REST port")
    parser.add_argument("--redis-url", default="", help="use this Redis instead of starting one")
    parser.add_argument("--learner-nproc", type=int, default=1, help="learner ranks (torchrun)")
    args = parser.parse_args(argv)

    ensure_tiny_model(args.model)
    config = StackConfig(model=args.model.resolve(), state_dir=args.state_dir, redis_url=args.redis_url,
                         ports={"coordinator": args.port}, learner_nproc=args.learner_nproc)
    stack = Stack(config)
    try:
        stack.start()
        print(f"\nMMRL is up. REST API: {stack.api_url}  (OpenAPI: {stack.api_url}/docs)")
        print(f"shared root: {config.shared_root.resolve()}   Redis: {stack.redis_url}")
        print(f"start a run:  mmrl run --api {stack.api_url} start --config configs/maze-tiny-cpu.yaml"
              "\nCtrl-C stops everything.", flush=True)
        while True:
            for name, proc in stack.procs.items():
                if proc.poll() is not None:
                    print(f"{name} exited with code {proc.returncode}; stopping the stack")
                    return 1
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    finally:
        stack.stop()
