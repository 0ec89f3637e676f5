"""`mmrl sft --config FILE`: supervised warm start on the conversations of the env's oracle (the
maze's BFS, Sokoban's, any env with the 'oracle' capability), then the greedy solve rate of the saved
model on the env's fixed eval set (through the env and rollout services); mmrl/sft.
`mmrl sft export --config FILE --out FILE.jsonl`: the same conversations as a chat dataset (JSONL +
PNG frames) that Hugging Face datasets and TRL's SFT trainer read (mmrl/sft/jsonl.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmrl.cli.options import add_overrides, overrides_from
from mmrl.cli.stack import Stack, StackConfig
from services.common.config_files import load_model_file
from services.common.messages import summary


def load_sft_config(path: Path, out: Path | None, base_model: Path | None,
                    overrides: dict[str, Any] | None = None) -> Any:
    """The SFT config at `path` with `overrides` (dotted keys), then `out` and `base_model` when
    given; UsageError naming the file and the settings that are wrong."""
    from mmrl.sft.config import SftConfig

    given = {"out": str(out) if out is not None else None,
             "base_model": str(base_model) if base_model is not None else None}
    return load_model_file(SftConfig, path, {**(overrides or {}), **{k: v for k, v in given.items() if v}})


def run_sft(config: Any, state_dir: Path, evaluate_after: bool = True, quiet: bool = False,
            nproc: int = 1) -> dict[str, Any]:
    """Trains (env service started locally; `nproc` ranks), saves, then evaluates the saved model."""
    from mmrl.envcheck.chance import chance_rate
    from mmrl.sft.train import train_sft

    say = (lambda _msg: None) if quiet else (lambda msg: print(msg, flush=True))
    stack = Stack(StackConfig(model=Path(config.out).resolve(), state_dir=state_dir, env_name=config.env))
    try:
        stack.start(("env",), log=not quiet)
        if nproc > 1:
            report = train_on_ranks(config, stack.address("env"), state_dir, nproc, quiet)
        else:
            check = validation_check(stack, config) if config.band is not None else None
            report = train_sft(config, stack.address("env"), progress=say, check=check)
        if evaluate_after:
            from mmrl.cli.eval import evaluate

            stack.config.model = Path(config.out).resolve()
            stack.start(("rollout",), log=not quiet)
            summary, _ = asyncio.run(evaluate(stack.address("env"), stack.address("rollout"), Path(config.out),
                                              samples=0, system_prompt=config.system_prompt,
                                              history_window=config.history_window))
            report["eval"] = summary
            chance = asyncio.run(chance_rate(stack.address("env"))).as_dict()
            report["chance"] = chance
            say(f"sft eval: greedy solve rate {summary['greedy_solve_rate']:.4f} on {summary['episodes']} eval "
                f"tasks; a uniform random policy solves {chance['chance_solve_rate']:.4f}"
                + ("" if summary["greedy_solve_rate"] > chance["chance_solve_rate"] else
                   " (not above chance: the start does not read its frames yet; docs/environments.md, 'Chance')"))
            report_path = Path(config.out) / "sft_report.json"
            report_path.write_text(json.dumps(report, indent=2))
    finally:
        stack.stop()
    return report


def train_on_ranks(config: Any, env_address: str, state_dir: Path, nproc: int, quiet: bool) -> dict[str, Any]:
    """`train_sft` on `nproc` ranks under torchrun (mmrl/sft/worker.py); returns rank 0's report."""
    state_dir.mkdir(parents=True, exist_ok=True)
    config_path, report_path = state_dir / "sft-config.json", state_dir / "sft-report.json"
    config_path.write_text(config.model_dump_json())
    report_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "mmrl.sft.worker", "--config-json", str(config_path), "--env", env_address,
               "--state-dir", str(state_dir / "checks"), "--report", str(report_path)]
    done = subprocess.run(command, stdout=subprocess.DEVNULL if quiet else None, check=False)
    if done.returncode != 0 or not report_path.is_file():
        raise RuntimeError(f"the SFT ranks failed (exit status {done.returncode}); torchrun's output above "
                           "names the rank and the error")
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def validation_check(stack: Stack, config: Any) -> Callable[[Path, list[Any]], dict[str, Any]]:
    """The SFT's check (`band`): a rollout service on the checkpoint, then the greedy (and, with
    `check_samples`, the sampled) solve rate of the validation tasks through it and the stack's env
    service."""
    from mmrl.cli.eval import evaluate

    def check(model_dir: Path, tasks: list[Any]) -> dict[str, Any]:
        stack.config.model = model_dir.resolve()
        stack.start(("rollout",), log=False)
        try:
            summary, _ = asyncio.run(evaluate(stack.address("env"), stack.address("rollout"), model_dir,
                                              specs=tasks, samples=config.check_samples,
                                              system_prompt=config.system_prompt,
                                              history_window=config.history_window))
        finally:
            stack.stop_service("rollout")
        return summary

    return check


def export_conversations(config: Any, out: Path, state_dir: Path, quiet: bool = False) -> dict[str, Any]:
    """Plays the SFT's expert conversations on a locally started env service and writes them as JSONL."""
    from mmrl.sft.data import draw_tasks, expert_conversations, image_token_counter
    from mmrl.sft.jsonl import write_jsonl
    from services.learner.batch import ModelSpec
    from services.learner.policy import load_processor

    processor = load_processor(Path(config.base_model))
    from transformers import AutoConfig

    spec = ModelSpec.from_config(AutoConfig.from_pretrained(config.base_model))
    stack = Stack(StackConfig(model=Path(config.base_model).resolve(), state_dir=state_dir, env_name=config.env))
    try:
        stack.start(("env",), log=not quiet)
        tasks = draw_tasks(stack.address("env"), config)
        data = expert_conversations(stack.address("env"), config, tasks.training, processor.tokenizer,
                                    image_token_counter(processor, spec))
    finally:
        stack.stop()
    return write_jsonl(data, processor.tokenizer, out)


def export_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl sft export", description=summary(__doc__))
    parser.add_argument("--config", type=Path, required=True, help="SFT config YAML (its tasks and detours)")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file (frames go to images/ beside it)")
    parser.add_argument("--base-model", type=Path, help="override the model whose tokenizer writes the text")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl/sft-export"), help="logs of the env service")
    args = parser.parse_args(argv)
    config = load_sft_config(args.config, None, args.base_model)
    print(json.dumps(export_conversations(config, args.out, args.state_dir)))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    parser = argparse.ArgumentParser(prog="mmrl sft", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="SFT config YAML (configs/sft-maze-tiny.yaml)")
    parser.add_argument("--out", type=Path, help="override the output model directory")
    parser.add_argument("--base-model", type=Path, help="override the model to fine-tune")
    parser.add_argument("--state-dir", type=Path, default=Path(".mmrl/sft"), help="logs of the services it starts")
    parser.add_argument("--no-eval", action="store_true", help="skip the eval of the saved model")
    parser.add_argument("--nproc", type=int, default=1,
                        help="ranks (torchrun, FSDP2; one per GPU on a GPU node); 1 trains in this process")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    add_overrides(parser, "SFT config")
    args = parser.parse_args(argv)
    config = load_sft_config(args.config, args.out, args.base_model, overrides_from(args))
    if args.nproc < 1:
        parser.error(f"--nproc must be at least 1, got {args.nproc}")
    report = run_sft(config, args.state_dir, evaluate_after=not args.no_eval, nproc=args.nproc)
    result = {"out": config.out, "sft_wall_s": report["sft_wall_s"], "updates": report["updates"],
              "final_loss": report["final_loss"],
              "solve_rate": report.get("eval", {}).get("greedy_solve_rate")}
    print(json.dumps(result) if args.json else f"saved {config.out}")
    return 0
