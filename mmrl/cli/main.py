"""`mmrl` entry point. Each command forwards its remaining arguments to a module's `main(argv)`,
imported only when that command runs, so `mmrl --help` stays fast and imports no torch or vLLM."""

from __future__ import annotations

import importlib
import sys

# command words -> (module, help). The module defines `main(argv: list[str]) -> int`.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("init-model",): ("services.common.tiny_model", "build a random-initialised tiny Qwen3-VL model"),
    ("sft",): ("mmrl.cli.sft", "supervised warm start on BFS-optimal maze conversations"),
    ("export",): ("mmrl.cli.export", "merge a trained adapter into its base as a standalone HF model"),
    ("serve", "env"): ("services.env.main", "serve the maze environment over gRPC"),
    ("serve", "rollout"): ("services.rollout.main", "serve vLLM generation over gRPC"),
    ("serve", "learner"): ("services.learner.main", "serve the GRPO learner over gRPC (torchrun)"),
    ("serve", "coordinator"): ("services.coordinator.main", "serve the REST API and run loop"),
    ("up",): ("mmrl.cli.up", "start the whole stack as local processes (Redis included)"),
    ("run",): ("mmrl.cli.run", "start, watch, pause, resume or stop training runs"),
    ("eval",): ("mmrl.cli.eval", "evaluate a model/adapter on the fixed eval set"),
    ("demo",): ("mmrl.cli.demo", "SFT warm start + GRPO run, with plots (the main job)"),
    ("bench", "env"): ("services.env.bench", "benchmark the maze environment"),
    ("bench", "rollout"): ("services.rollout.bench", "benchmark vLLM generation and adapters"),
    ("bench", "learner"): ("services.learner.bench", "benchmark GRPO training steps"),
    ("bench", "gpu"): ("services.learner.gpu_check", "check the learner on one GPU (scripts/gpu-check.sh)"),
    ("bench", "e2e"): ("mmrl.cli.bench_e2e", "benchmark whole GRPO steps through every service"),
}


def _usage() -> str:
    lines = ["usage: mmrl COMMAND [ARGS...]", "", "commands:"]
    for words, (_, help_text) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<20} {help_text}")
    lines.append("")
    lines.append("`mmrl COMMAND --help` shows a command's options.")
    return "\n".join(lines)


def _says_what_went_wrong(error: Exception) -> bool:
    """Errors whose message is the whole story (a service that did not start, a service call that
    failed after its retries): printed as one line, not as a traceback of the CLI's own code."""
    from mmrl.cli.stack import StackError
    from services.coordinator.clients import ServiceError

    return isinstance(error, StackError | ServiceError)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    for words, (module_name, _) in sorted(COMMANDS.items(), key=lambda kv: -len(kv[0])):
        if tuple(args[: len(words)]) == words:
            module = importlib.import_module(module_name)
            try:
                return int(module.main(args[len(words):]) or 0)
            except KeyboardInterrupt:
                print(f"mmrl {' '.join(words)}: interrupted", file=sys.stderr)
                return 130
            except Exception as error:
                if not _says_what_went_wrong(error):
                    raise
                print(f"mmrl {' '.join(words)}: {error}", file=sys.stderr)
                return 1
    print(f"mmrl: unknown command {' '.join(args[:2])!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
