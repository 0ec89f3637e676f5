"""`mmrl eval`: evaluate a model (and optionally a LoRA adapter) on the fixed eval set, on held-out
mazes or on a seed range, through the env and rollout services (started locally unless their
addresses are given).

`--env-name sokoban` evaluates on Sokoban (its default eval set, or `--eval-set sokoban-held-out-128`:
levels no training plays, outside the fixed set; docs/sokoban.md).

`--held-out N`: N mazes that no training ever plays and the fixed set does not hold: distinct
layouts reserved for eval sets (docs/env.md), from seed 1,900,000 (`HELD_OUT_FIRST_SEED`) on. A
`--seeds` range is played as it is: most of its layouts are training layouts too."""

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
from services.common.maze import eval_seeds, layout_key
from services.coordinator.clients import CallPolicy
from services.coordinator.episodes import Timers
from services.coordinator.evaluation import EvalPlan, eval_turn_limit, run_eval
from services.coordinator.manager import load_tokenizer
from services.coordinator.replicas import Services
from services.coordinator.wire import TaskSpec
from services.env.config import EnvConfig
from services.env.evalset import RECIPES, get_eval_set

PRESETS = {"easy": "maze-easy-64", "hard": "maze-hard-64"}  # --size: the eval set (RECIPES) it names
HELD_OUT_FIRST_SEED = 1_900_000
MAX_EPISODES = EnvConfig.model_fields["max_batch"].default  # episodes one CreateEpisodes call creates


def parse_seeds(text: str) -> range:
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(last) < int(first):
        raise SystemExit(f"--seeds expects A-B with A <= B, got {text!r}")
    return range(int(first), int(last) + 1)


def held_out_seeds(size: str, count: int) -> list[int]:
    """`count` seeds of distinct eval-reserved layouts outside the fixed set of the `size` preset."""
    name = PRESETS[size]
    grid = RECIPES[name].size
    fixed = frozenset(layout_key(spec.seed, grid) for spec in get_eval_set(name).specs)
    try:
        return eval_seeds(HELD_OUT_FIRST_SEED, count, grid, exclude=fixed)
    except ValueError as exc:
        raise SystemExit(f"--held-out {count}: {exc}") from None


async def evaluate(
    env_addr: str, rollout_addr: str, model: Path, *, size: str = "easy", seeds: Sequence[int] | None = None,
    maze: tuple[int, int] | None = None, adapter: tuple[str, int, str] | None = None, samples: int = 0,
    temperature: float = 1.0, max_tokens: int = 4, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    keep_frames: bool = False, eval_set: str | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """Greedy (and optionally sampled) evaluation; `adapter` is (run_id, version, path) to load first.
    `seeds` are played with the grid and move limit of the `size` preset, or with `maze` = (grid, max_moves).
    `eval_set` names the env's eval set to play instead of the `size` preset's ("" = the env's default)."""
    name = PRESETS[size] if eval_set is None else eval_set
    preset = RECIPES[PRESETS[size]]  # the seeds' grid and budget, and the turn limit of specs without one
    grid, max_moves = maze or (preset.size, preset.max_moves)
    services = Services.connect([env_addr], [rollout_addr], "127.0.0.1:1", CallPolicy(timeout_s=600, retries=2))
    try:
        if seeds is None:
            specs = (await services.env.eval_set(name)).specs
        else:
            specs = [TaskSpec(seed=s, max_moves=max_moves, options={"size": str(grid)}) for s in seeds]
        version = 0
        run_id = "eval"
        if adapter is not None:
            run_id, version, path = adapter
            await services.rollouts.load_adapter(run_id, version, path)
        tokenizer = load_tokenizer(str(model))
        max_turns = eval_turn_limit(specs, max_moves)
        sampled = f", then {samples} sampled episodes each" if samples else ""
        print(f"evaluating {len(specs)} mazes: greedy{sampled}, up to {max_turns} turns, all mazes at once ...",
              file=sys.stderr, flush=True)
        plan = EvalPlan(specs=specs, max_tokens=max_tokens, sampled_samples=samples,
                        sampled_temperature=temperature, max_turns=max_turns,
                        system_prompt=system_prompt)
        summary, greedy = await run_eval(services, tokenizer, ChatTokens.from_tokenizer(tokenizer), plan,
                                         run_id=run_id, adapter_version=version, seed=0, timers=Timers(),
                                         keep_frames=keep_frames)
    finally:
        await services.close()
    return summary, greedy


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
    parser.add_argument("--size", choices=sorted(PRESETS), default="easy", help="maze preset / eval set")
    mazes_from = parser.add_mutually_exclusive_group()
    mazes_from.add_argument("--held-out", type=int, metavar="N",
                            help="N mazes never trained on, outside the fixed set, instead of it")
    mazes_from.add_argument("--seeds", help="A-B: evaluate on this seed range instead of the fixed set")
    parser.add_argument("--env-name", choices=("maze", "sokoban"), default="maze",
                        help="the environment of the env service started (without --env); not the maze: its "
                             "default eval set unless --eval-set names one (docs/sokoban.md)")
    parser.add_argument("--eval-set", help="an eval set of the env service by name instead of the --size preset's "
                                           "(e.g. sokoban-held-out-128)")
    parser.add_argument("--samples", type=int, default=0, help="sampled episodes per maze besides greedy")
    parser.add_argument("--temperature", type=float, default=1.0, help="temperature of sampled episodes")
    parser.add_argument("--max-tokens", type=int, default=4,
                        help="token budget of one action (a run's evals use its sampling.max_tokens)")
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
    if args.max_tokens < 1:
        raise SystemExit(f"--max-tokens {args.max_tokens}: must be 1 or more")
    if args.held_out is not None and args.held_out < 1:
        raise SystemExit(f"--held-out {args.held_out}: must be 1 or more")
    eval_set = args.eval_set if args.eval_set is not None else (None if args.env_name == "maze" else "")
    if eval_set is not None and (args.seeds or args.held_out):
        raise SystemExit("--seeds and --held-out are maze seeds: not with --eval-set or --env-name sokoban")
    seeds: Sequence[int] | None = None  # checked before anything starts
    if args.seeds:
        seeds = parse_seeds(args.seeds)
    elif args.held_out:
        seeds = held_out_seeds(args.size, args.held_out)
    mazes = len(seeds) if seeds is not None else RECIPES[PRESETS[args.size]].num_tasks
    if eval_set is None and max(mazes, mazes * args.samples) > MAX_EPISODES:  # the greedy and the sampled episodes: one call each
        raise SystemExit(f"{mazes} mazes x --samples {args.samples} is {mazes * args.samples} sampled episodes at "
                         f"once; the env service creates at most {MAX_EPISODES} in one call: fewer mazes or samples")

    try:
        lora_rank = storage.adapter_rank(args.adapter) if args.adapter else 0
    except ValueError as exc:
        raise SystemExit(f"--adapter {args.adapter}: {exc}") from exc

    started = time.perf_counter()
    # An adapter from elsewhere (a checkpoint, another trainer) carries no probe: it is served unchecked.
    stack = Stack(StackConfig(model=args.model.resolve(), state_dir=args.state_dir, lora_rank=lora_rank,
                              env_name=args.env_name, rollout_args=["--adapter-probe", "if_present"]))
    try:
        needed = tuple(s for s, given in (("env", args.env), ("rollout", args.rollout)) if not given)
        if needed:
            stack.start(needed, log=not args.json)
        adapter = stage_adapter(args.adapter, stack.config.shared_root) if args.adapter else None
        summary, _ = asyncio.run(evaluate(
            args.env or stack.address("env"), args.rollout or stack.address("rollout"), args.model,
            size=args.size, seeds=seeds, adapter=adapter,
            samples=args.samples, temperature=args.temperature, max_tokens=args.max_tokens, eval_set=eval_set))
    finally:
        stack.stop()
    result = {
        "solve_rate": summary["greedy_solve_rate"], "episodes": summary["episodes"],
        "mean_moves_over_optimal": summary["mean_moves_over_optimal"],
        "invalid_fraction": summary["greedy_invalid_fraction"],
        "sampled_solve_rate": summary["sampled_solve_rate"], "sampled_pass_rate": summary["sampled_pass_rate"],
        "samples": args.samples, "model": str(args.model),
        "adapter": str(args.adapter) if args.adapter else None, "wall_s": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(result))
    else:
        ratio = result["mean_moves_over_optimal"]
        print(f"solve rate {result['solve_rate']:.4f} over {result['episodes']} mazes; mean moves/optimal "
              f"{ratio:.3f}" if ratio is not None else f"solve rate {result['solve_rate']:.4f}")
        if args.samples > 0:
            print(f"sampled ({args.samples} per maze at temperature {args.temperature}): solve rate "
                  f"{result['sampled_solve_rate']:.4f}, solved by at least one {result['sampled_pass_rate']:.4f}")
    return 0
