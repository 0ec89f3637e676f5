"""`mmrl eval`: evaluate a model (and optionally a LoRA adapter) on an eval set of the environment, or
on a range of seeds, through the env and rollout services (started locally unless their addresses are
given).

`--env-name NAME` picks the environment of the env service it starts (services/env/registry.py; the
maze by default) and `--eval-set NAME` one of its eval sets (its default otherwise), e.g.
`maze-held-out-256` or `sokoban-held-out-128`: tasks no training plays, outside the fixed set. The
system turn is the one the model's SFT trained with (its sft_report.json) unless `--system-prompt`
gives another; a model without a report gets the maze's. So is its history window (how many answered
turns each prompt keeps) unless `--history-window` gives another. A
`--seeds A-B` range is played as it is, with `--option KEY=VALUE` and `--max-moves`: most of its tasks
may be training tasks too."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmrl.cli.stack import Stack, StackConfig
from services.common import storage
from services.common.conversation import DEFAULT_SYSTEM_PROMPT, ChatTokens
from services.coordinator.grpo.episodes import Timers
from services.coordinator.grpo.evaluation import (
    STUCK_TURNS,
    EvalPlan,
    eval_turn_limit,
    greedy_failures,
    run_eval,
)
from services.coordinator.grpo.tasks import action_token_budget
from services.coordinator.ops.clients import CallPolicy
from services.coordinator.ops.manager import load_tokenizer
from services.coordinator.ops.replicas import Services
from services.coordinator.ops.wire import TaskSpec
from services.env import registry
from services.env.config import EnvConfig

MAX_EPISODES = EnvConfig.model_fields["max_batch"].default  # episodes one CreateEpisodes call creates
DEFAULT_MAX_MOVES = 20


def parse_seeds(text: str) -> range:
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(last) < int(first):
        raise SystemExit(f"--seeds expects A-B with A <= B, got {text!r}")
    return range(int(first), int(last) + 1)


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--option expects KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def check_batch(num_tasks: int, samples: int) -> None:
    """Refuses more episodes than the env service creates in one call (the greedy and the sampled
    episodes are a call each)."""
    if max(num_tasks, num_tasks * samples) > MAX_EPISODES:
        raise SystemExit(f"{num_tasks} tasks x --samples {samples} is {num_tasks * samples} sampled episodes at "
                         f"once; the env service creates at most {MAX_EPISODES} in one call: fewer tasks or samples")


async def evaluate(
    env_addr: str, rollout_addr: str, model: Path, *, eval_set: str = "", specs: Sequence[Any] | None = None,
    adapter: tuple[str, int, str] | None = None, samples: int = 0, temperature: float = 1.0, max_tokens: int | None = None,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT, keep_frames: bool = False, history_window: int | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """Greedy (and optionally sampled) evaluation of the env's eval set `eval_set` ("" = its default), or of
    `specs` (task specs: seed, max_moves, options) when given; `adapter` is (run_id, version, path) to load
    first. `max_tokens` None: the tokens of the env's longest action word (`action_token_budget`), what
    the run's evals measure where `sampling.max_tokens` holds one word."""
    services = Services.connect([env_addr], [rollout_addr], "127.0.0.1:1", CallPolicy(timeout_s=600, retries=2))
    try:
        if specs is None:
            tasks = list((await services.env.eval_set(eval_set)).specs)
        else:
            tasks = [TaskSpec(seed=s.seed, max_moves=s.max_moves, options=dict(s.options)) for s in specs]
        check_batch(len(tasks), samples)
        version = 0
        run_id = "eval"
        if adapter is not None:
            run_id, version, path = adapter
            await services.rollouts.load_adapter(run_id, version, path)
        tokenizer = load_tokenizer(str(model))
        if max_tokens is None:
            max_tokens = action_token_budget(tokenizer, (await services.env.info()).actions)
        max_turns = eval_turn_limit(tasks, DEFAULT_MAX_MOVES)
        sampled = f", then {samples} sampled episodes each" if samples else ""
        print(f"evaluating {len(tasks)} tasks: greedy{sampled}, up to {max_turns} turns, all tasks at once ...",
              file=sys.stderr, flush=True)
        plan = EvalPlan(specs=tasks, max_tokens=max_tokens, sampled_samples=samples,
                        sampled_temperature=temperature, max_turns=max_turns,
                        system_prompt=system_prompt, history_window=history_window)
        summary, greedy = await run_eval(services, tokenizer, ChatTokens.from_tokenizer(tokenizer), plan,
                                         run_id=run_id, adapter_version=version, seed=0, timers=Timers(),
                                         keep_frames=keep_frames)
    finally:
        await services.close()
    return summary, greedy


def trained_config(model: Path) -> dict[str, Any]:
    """The config the model's SFT trained with (its sft_report.json's), {} without one."""
    try:
        report = json.loads((model / "sft_report.json").read_text())
    except (OSError, ValueError):
        return {}
    config = report.get("config") if isinstance(report, dict) else None
    return config if isinstance(config, dict) else {}


def trained_system_prompt(model: Path) -> str | None:
    """The system prompt the model's SFT trained with, None without one."""
    prompt = trained_config(model).get("system_prompt")
    return prompt if isinstance(prompt, str) and prompt else None


def trained_history_window(model: Path) -> int | None:
    """The history window the model's SFT trained with (None: whole conversations, or no SFT report)."""
    window = trained_config(model).get("history_window")
    return window if isinstance(window, int) else None


def check_history_window(model: Path, window: int | None) -> None:
    """Refuses a run whose prompts keep another history than its SFT start trained on."""
    if not (model / "sft_report.json").is_file():
        return
    trained = trained_history_window(model)
    if trained != window:
        def name(w: int | None) -> str:
            return "the whole conversation" if w is None else f"{w} answered turns"
        raise SystemExit(f"{model} was trained on prompts keeping {name(trained)} (its sft_report.json's "
                         f"history_window) but the run's history_window keeps {name(window)}: set "
                         f"history_window: {trained if trained is not None else 'null'} in the run config")


def stage_adapter(adapter_dir: Path, shared_root: Path) -> tuple[str, int, str]:
    """Copies an adapter into the shared root as version 1 of run 'eval' (with a fresh manifest)."""
    target = storage.adapter_dir(shared_root, "eval", 1)
    if target.exists():
        shutil.rmtree(target)
    storage.publish_adapter_copy(adapter_dir, target)
    return "eval", 1, str(target.resolve())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl eval", description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    parser.add_argument("--adapter", type=Path, help="LoRA adapter directory (peft format)")
    parser.add_argument("--env-name", choices=registry.names(), default="maze",
                        help="the environment of the env service started (without --env; default maze)")
    tasks_from = parser.add_mutually_exclusive_group()
    tasks_from.add_argument("--eval-set", default="",
                            help="an eval set of the env by name (default: its fixed set), e.g. maze-held-out-256")
    tasks_from.add_argument("--seeds", help="A-B: evaluate on this seed range instead of an eval set")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="with --seeds: an environment option of every task (e.g. size=9)")
    parser.add_argument("--max-moves", type=int, default=DEFAULT_MAX_MOVES, help="with --seeds: the move budget")
    parser.add_argument("--samples", type=int, default=0, help="sampled episodes per task besides greedy")
    parser.add_argument("--temperature", type=float, default=1.0, help="temperature of sampled episodes")
    parser.add_argument("--system-prompt", help="the system turn of every episode (default: the one the model's "
                                                "SFT trained with, from its sft_report.json; else the maze's)")
    parser.add_argument("--history-window", type=int, metavar="K",
                        help="answered turns each prompt keeps (default: the model's SFT's history_window, "
                             "from its sft_report.json; else the whole conversation)")
    parser.add_argument("--max-tokens", type=int,
                        help="token budget of one action (default: the tokens of the env's longest action "
                             "word, as the shipped configs' sampling.max_tokens; a run's evals use its own)")
    parser.add_argument("--env", help="env service host:port (default: start one)")
    parser.add_argument("--rollout", help="rollout service host:port (default: start one on --model)")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl/eval"), help="logs of the services it starts")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: no config.json there")
    if args.samples < 0:
        raise SystemExit(f"--samples {args.samples}: must be 0 or more")
    if args.adapter and args.rollout:
        raise SystemExit("--adapter needs the rollout service started by mmrl eval (omit --rollout)")
    if args.adapter and not all((args.adapter / name).is_file() for name in storage.ADAPTER_FILES):
        raise SystemExit(f"--adapter {args.adapter}: no {' + '.join(storage.ADAPTER_FILES)} there")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise SystemExit(f"--max-tokens {args.max_tokens}: must be 1 or more")
    if (args.option or args.max_moves != DEFAULT_MAX_MOVES) and not args.seeds:
        raise SystemExit("--option and --max-moves go with --seeds (an eval set has its own)")
    specs = None  # checked before anything starts
    if args.seeds:
        options = parse_options(args.option)
        specs = [TaskSpec(seed=seed, max_moves=args.max_moves, options=options) for seed in parse_seeds(args.seeds)]
        check_batch(len(specs), args.samples)

    try:
        lora_rank = storage.adapter_rank(args.adapter) if args.adapter else 0
        tower_lora = bool(storage.adapter_vision_modules(args.adapter)) if args.adapter else False
    except ValueError as exc:
        raise SystemExit(f"--adapter {args.adapter}: {exc}") from exc

    system_prompt = args.system_prompt or trained_system_prompt(args.model) or DEFAULT_SYSTEM_PROMPT
    if args.history_window is not None and args.history_window < 0:
        raise SystemExit(f"--history-window must be >= 0 answered turns, got {args.history_window}")
    history_window = args.history_window if args.history_window is not None else trained_history_window(args.model)
    if not args.json:
        print(f"system prompt: {system_prompt!r}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    # An adapter from elsewhere (a checkpoint, another trainer) carries no probe: it is served unchecked.
    stack = Stack(StackConfig(model=args.model.resolve(), state_dir=args.state_dir, lora_rank=lora_rank,
                              tower_lora=tower_lora, env_name=args.env_name, rollout_args=["--adapter-probe", "if_present"]))
    try:
        needed = tuple(s for s, given in (("env", args.env), ("rollout", args.rollout)) if not given)
        if needed:
            stack.start(needed, log=not args.json)
        adapter = stage_adapter(args.adapter, stack.config.shared_root) if args.adapter else None
        summary, _ = asyncio.run(evaluate(
            args.env or stack.address("env"), args.rollout or stack.address("rollout"), args.model,
            eval_set=args.eval_set, specs=specs, adapter=adapter,
            samples=args.samples, temperature=args.temperature, max_tokens=args.max_tokens,
            system_prompt=system_prompt, history_window=history_window))
    finally:
        stack.stop()
    result = {
        "solve_rate": summary["greedy_solve_rate"], "episodes": summary["episodes"],
        "eval_set": args.eval_set if specs is None else None,
        "mean_moves_over_optimal": summary["mean_moves_over_optimal"],
        "invalid_fraction": summary["greedy_invalid_fraction"],
        "noop_fraction": summary["greedy_noop_fraction"],
        "failed": greedy_failures(summary),
        "sampled_solve_rate": summary["sampled_solve_rate"], "sampled_pass_rate": summary["sampled_pass_rate"],
        "samples": args.samples, "model": str(args.model), "system_prompt": system_prompt,
        "history_window": history_window,
        "adapter": str(args.adapter) if args.adapter else None, "wall_s": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(result))
    else:
        ratio = result["mean_moves_over_optimal"]
        print(f"solve rate {result['solve_rate']:.4f} over {result['episodes']} tasks; mean moves/optimal "
              f"{ratio:.3f}" if ratio is not None else f"solve rate {result['solve_rate']:.4f}")
        failed = result["failed"]
        print(f"greedy failures, as shares of the tasks: stuck {failed['stuck']:.3f} (the last {STUCK_TURNS} moves "
              f"changed nothing), cycling {failed['cycling']:.3f}, other {failed['other']:.3f}; "
              f"no-op moves {result['noop_fraction']:.3f}")
        if args.samples > 0:
            print(f"sampled ({args.samples} per task at temperature {args.temperature}): solve rate "
                  f"{result['sampled_solve_rate']:.4f}, solved by at least one {result['sampled_pass_rate']:.4f}")
    return 0
