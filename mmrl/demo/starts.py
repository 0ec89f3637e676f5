"""Where a demo or sweep starts: each environment's shipped configs, found by name, and the SFT
checkpoint (reused while its config is unchanged, else trained now)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.cli.sft import load_sft_config, run_sft

CONFIGS = Path("configs")


def shipped_configs(env: str) -> tuple[Path, Path]:
    """The environment's GRPO run config and SFT config: configs/<env>-tiny-cpu.yaml and
    configs/sft-<env>-tiny.yaml."""
    return CONFIGS / f"{env}-tiny-cpu.yaml", CONFIGS / f"sft-{env}-tiny.yaml"


def from_scratch(env: str, base_model: Path) -> Path:
    """The start of an env with no SFT config: the base model itself (GRPO from scratch)."""
    print(f"no SFT config for {env} (configs/sft-{env}-tiny.yaml): GRPO starts from the base model "
          f"{base_model}", flush=True)
    return base_model


def sft_checkpoint(sft_config: Path, state_dir: Path, env: str, base_model: Path) -> tuple[Path, float, dict[str, Any]]:
    """The SFT start of `sft_config`: reused when a checkpoint of the same config exists under
    `state_dir`, else trained now. Returns (model directory, SFT seconds, its report)."""
    config = load_sft_config(sft_config, state_dir / "models" / f"sft-{env}", base_model.resolve())
    out = Path(config.out)
    report_path = out / "sft_report.json"
    if report_path.is_file():
        report = json.loads(report_path.read_text())
        if report.get("fingerprint") == config.fingerprint() and "eval" in report:
            print(f"reusing the SFT checkpoint {out} (same config; trained in {report['sft_wall_s']:.0f} s)")
            return out, float(report["sft_wall_s"]), report
    budget = f"{config.updates} updates"
    if config.band is not None:
        budget += f", keeping the last check inside [{config.band[0]}, {config.band[1]}]"
        if config.stop_above_band:
            budget = f"at most {budget}, ending at the first check above it"
    print(f"SFT warm start ({budget}) -> {out}", flush=True)
    report = run_sft(config, state_dir / "sft")
    return out, float(report["sft_wall_s"]), report
