"""One rank of `mmrl sft --nproc N`, started by torchrun: trains on the env service the launcher
started; rank 0 runs the checks (`band`: a rollout service on each checkpoint) and writes the
report the launcher reads."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from mmrl.cli.sft import validation_check
    from mmrl.cli.stack import Stack, StackConfig
    from mmrl.sft.config import SftConfig
    from mmrl.sft.train import train_sft

    parser = argparse.ArgumentParser(prog="python -m mmrl.sft.worker", description=__doc__)
    parser.add_argument("--config-json", type=Path, required=True, help="the SFT config as JSON")
    parser.add_argument("--env", required=True, help="env service host:port")
    parser.add_argument("--state-dir", type=Path, required=True, help="logs of the rollout services checks start")
    parser.add_argument("--report", type=Path, required=True, help="where rank 0 writes the report (JSON)")
    args = parser.parse_args(argv)
    config = SftConfig.model_validate_json(args.config_json.read_text())
    is_main = int(os.environ.get("RANK", "0")) == 0
    check = None
    if config.band is not None and is_main:
        host, port = args.env.rsplit(":", 1)
        stack = Stack(StackConfig(model=Path(config.out).resolve(), state_dir=args.state_dir, host=host,
                                  ports={"env": int(port)}, env_name=config.env))
        check = validation_check(stack, config)
    report = train_sft(config, args.env, progress=lambda message: print(message, flush=True), check=check)
    if is_main:
        args.report.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
