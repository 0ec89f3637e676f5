"""`mmrl up`: the whole stack as local processes (Redis included), until Ctrl-C. `--env` picks the
environment: a registered one or a Gymnasium preset served by the stack, or the host:port of an env
server already running (yours: the stack starts no env and its runs play that one)."""

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


def env_names() -> list[str]:
    from services.env import registry
    from services.env.gym.presets import PRESETS

    return [*registry.names(), *PRESETS]


def env_choice(parser: argparse.ArgumentParser, text: str) -> tuple[str, str]:
    """(name, "") for an environment the stack serves, ("", address) for a server already running."""
    host, _, port = text.rpartition(":")
    if host and port.isdigit():
        return "", text
    if text not in env_names():
        parser.error(f"--env {text!r}: neither host:port nor one of {', '.join(env_names())}")
    return text, ""


def suggested_config(env_name: str) -> str:
    shipped = Path("configs") / f"{env_name}-tiny-cpu.yaml"
    return str(shipped) if env_name and shipped.is_file() else "YOUR_RUN.yaml"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl up", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help="model directory served by rollout and trained by the learner "
                             "(the tiny model is built there if missing)")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl"), help="logs, Redis data, shared root")
    parser.add_argument("--port", type=int, default=8000, help="coordinator REST port")
    parser.add_argument("--redis-url", default="", help="use this Redis instead of starting one")
    parser.add_argument("--learner-nproc", type=int, default=1, help="learner ranks (torchrun) of each pool")
    parser.add_argument("--pools", type=int, default=1, help="learner pools, each a learner service holding one "
                        "run; runs beyond them wait in the queue, and all share the rollout replica")
    parser.add_argument("--env", default="maze", metavar="NAME|HOST:PORT",
                        help=f"the environment: one the stack serves ({', '.join(env_names())}; default maze) "
                             "or the address of an env server already running")
    parser.add_argument("--tower-lora", action="store_true",
                        help="the rollout service also serves adapters on the vision tower (runs whose "
                             "lora.target_modules select it, e.g. TOWER_LORA_TARGETS in services/common/training.py)")
    args = parser.parse_args(argv)
    env_name, env_addr = env_choice(parser, args.env)
    if args.pools < 1:
        parser.error(f"--pools is at least 1, got {args.pools}")

    ensure_tiny_model(args.model)
    config = StackConfig(model=args.model.resolve(), state_dir=args.state_dir, redis_url=args.redis_url,
                         ports={"coordinator": args.port}, learner_nproc=args.learner_nproc, env_name=env_name,
                         env_addr=env_addr, learner_pools=args.pools, tower_lora=args.tower_lora)
    stack = Stack(config)
    try:
        stack.start()
        print(f"\nMMRL is up. REST API: {stack.api_url}  (OpenAPI: {stack.api_url}/docs)")
        print(f"shared root: {config.shared_root.resolve()}   Redis: {stack.redis_url}")
        print(f"env: {env_addr or env_name} at {stack.address('env')}")
        print(f"start a run:  mmrl run --api {stack.api_url} start --config {suggested_config(env_name)}"
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
