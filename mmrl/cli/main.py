"""`mmrl` entry point. Each command forwards its remaining arguments to a module's `main(argv)`,
imported only when that command runs, so `mmrl --help` stays fast and imports no torch or vLLM.

Every command ends the same way on errors: a mistake of the user (a bad setting, a config file
that is missing or does not parse, a misspelt option: `UsageError`, pydantic's `ValidationError`,
an `OSError` naming a file, argparse's errors) is one line `mmrl COMMAND: what is wrong` on stderr
and exit status 2; a command that could not do its work (a service that cannot be reached or did
not start, a failed service call) is one line and exit status 1; Ctrl-C is exit status 130; any
other error is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from importlib import metadata

from services.common.user_errors import CommandFailed, UsageError, one_line

# command words -> (entry, help). The entry is "module" (its `main`) or "module:function", a function
# `(argv: list[str]) -> int`.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("init-model",): ("mmrl.models.tiny", "build a random-initialised tiny Qwen3-VL model"),
    ("sft",): ("mmrl.cli.sft", "supervised warm start on the conversations of the env's oracle"),
    ("sft", "export"): ("mmrl.cli.sft:export_main", "write the SFT conversations as a chat dataset (JSONL + PNG)"),
    ("export",): ("mmrl.cli.export", "merge a trained adapter into its base as a standalone HF model"),
    ("serve", "env"): ("services.env.main", "serve an environment over gRPC (maze, sokoban, Gymnasium, OpenEnv)"),
    ("serve", "openenv"): ("services.env.openenv.main", "serve an MMRL environment as an OpenEnv server"),
    ("serve", "rollout"): ("services.rollout.main", "serve vLLM generation over gRPC"),
    ("serve", "learner"): ("services.learner.main", "serve the GRPO learner over gRPC (torchrun)"),
    ("serve", "coordinator"): ("services.coordinator.main", "serve the REST API and run loop"),
    ("up",): ("mmrl.cli.up", "start the whole stack as local processes (Redis included)"),
    ("run",): ("mmrl.cli.run", "start, watch, pause, resume or stop training runs"),
    ("eval",): ("mmrl.cli.eval", "evaluate a model/adapter on an eval set of the environment"),
    ("demo",): ("mmrl.cli.demo", "SFT warm start + GRPO run, with plots (the main job)"),
    ("sweep",): ("mmrl.demo.sweep", "the demo's GRPO over several seeds and SFT starts, as a distribution"),
    ("sweep", "merge"): ("mmrl.demo.merge", "finished sweeps' runs as one distribution (sweep.json, band)"),
    ("report",): ("mmrl.report.page", "write docs/results.md from a demo's summary.json and curve.json"),
    ("config",): ("mmrl.cli.config", "show, validate or document configs and settings"),
    ("env", "check"): ("mmrl.cli.env_check", "check that an env server keeps the EnvService contract"),
    ("env", "chance"): ("mmrl.cli.env_chance", "solve rate of a uniform random policy on an env's eval set"),
    ("bench", "env"): ("mmrl.bench.env", "benchmark an environment's episodes"),
    ("bench", "rollout"): ("mmrl.bench.rollout", "benchmark vLLM generation and adapters"),
    ("bench", "learner"): ("mmrl.bench.learner", "benchmark GRPO training steps"),
    ("bench", "gpu"): ("mmrl.bench.gpu", "check the learner on one GPU (scripts/gpu-check.sh)"),
    ("bench", "e2e"): ("mmrl.bench.e2e", "benchmark whole GRPO steps through every service"),
    ("bench", "faults"): ("mmrl.bench.faults", "kill each service mid-step; the run must recover by itself"),
    ("bench", "pools"): ("mmrl.bench.pools", "two runs on two learner pools sharing a rollout, against one by one"),
}
HELP = ("-h", "--help", "help")


def version() -> str:
    try:
        return metadata.version("mmrl")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


def _usage(group: tuple[str, ...] = ()) -> str:
    name = " ".join(("mmrl", *group))
    lines = [f"usage: {name} COMMAND [ARGS...]", "", "commands:"]
    for words, (_, help_text) in COMMANDS.items():
        if words[: len(group)] == group:
            lines.append(f"  {' '.join(words):<20} {help_text}")
    lines += ["", "`mmrl COMMAND --help` shows a command's options."]
    if not group:
        lines += ["`mmrl --version` shows the version.", "",
                  "Exit status: 0 done, 1 the command could not do its work, 2 a usage or config error."]
    return "\n".join(lines)


def _groups() -> set[tuple[str, ...]]:
    return {words[:1] for words in COMMANDS if len(words) > 1}


def _exit_status(error: BaseException) -> int | None:
    """2 for a user's mistake, 1 for a command that could not do its work, None for a bug."""
    from pydantic import ValidationError

    from mmrl.cli.stack import StackError
    from services.coordinator.ops.clients import ServiceError

    if isinstance(error, UsageError | ValidationError | FileNotFoundError | IsADirectoryError | NotADirectoryError
                  | PermissionError):
        return 2
    if isinstance(error, CommandFailed | StackError | ServiceError):
        return 1
    return None


@contextlib.contextmanager
def _argparse_errors_raise() -> Iterator[None]:
    """argparse's errors (a misspelt option, a missing argument) of the `mmrl` parsers raise
    UsageError, told like every other mistake, instead of printing the usage and exiting."""
    original = argparse.ArgumentParser.error

    def error(self: argparse.ArgumentParser, message: str) -> None:  # type: ignore[misc]
        if not self.prog.startswith("mmrl"):  # a library's own parser
            original(self, message)
        raise UsageError(f"{message} (`{self.prog} --help` lists the options)")

    argparse.ArgumentParser.error = error  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def entry_point(entry: str) -> Callable[[list[str]], int | None]:
    """The function a COMMANDS entry names, its module imported now."""
    module_name, _, function = entry.partition(":")
    return getattr(importlib.import_module(module_name), function or "main")  # type: ignore[no-any-return]


def run_command(words: tuple[str, ...], entry: str, argv: list[str]) -> int:
    """Runs one command's entry point on `argv`; errors end it as the module docstring says."""
    name = " ".join(("mmrl", *words))
    try:
        with _argparse_errors_raise():
            return int(entry_point(entry)(argv) or 0)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as stop:
        if not isinstance(stop.code, str):  # --help (0) or a status the command chose
            raise
        print(f"{name}: {one_line(stop.code)}", file=sys.stderr)
        return 2
    except Exception as error:
        status = _exit_status(error)
        if status is None:
            raise
        print(f"{name}: {one_line(error)}", file=sys.stderr)
        return status


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in HELP:
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"mmrl {version()}")
        return 0
    for words, (entry, _) in sorted(COMMANDS.items(), key=lambda kv: -len(kv[0])):
        if tuple(args[: len(words)]) == words:
            return run_command(words, entry, args[len(words):])
    group = tuple(args[:1])
    if group in _groups():
        if args[1:2] and args[1] in HELP:
            print(_usage(group))
            return 0
        names = ", ".join(words[1] for words in COMMANDS if words[:1] == group)
        said = f"unknown command {args[1]!r}" if args[1:] else "a command is needed"
        print(f"mmrl {group[0]}: {said}: one of {names} (`mmrl {group[0]} --help`)", file=sys.stderr)
        return 2
    print(f"mmrl: unknown command {args[0]!r} (`mmrl --help` lists the commands)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
