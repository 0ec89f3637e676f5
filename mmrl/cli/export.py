"""`mmrl export --adapter DIR --merge --out DIR [--base-model DIR] [--dtype auto|float32|bfloat16]`:
a trained adapter (a published version or a checkpoint) merged into its base model as a standalone
Hugging Face model directory that stock vLLM and transformers load."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from services.common.messages import summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl export", description=summary(__doc__))
    parser.add_argument("--adapter", type=Path, required=True,
                        help="adapter directory: runs/<run>/adapters/v<N> or checkpoints/step_<N>")
    parser.add_argument("--merge", action="store_true", required=True,
                        help="fold the adapter into the base weights (the only export there is)")
    parser.add_argument("--out", type=Path, required=True, help="new model directory")
    parser.add_argument("--base-model", type=Path,
                        help="base model directory (default: the one the adapter records)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="dtype of the saved weights (auto: the base checkpoint's)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    from mmrl.export import merge_adapter

    try:
        out = merge_adapter(args.adapter, args.out, args.base_model, args.dtype, args.force)
    except ValueError as exc:
        parser.exit(1, f"mmrl export: {exc}\n")
    print(json.dumps({"out": str(out), "adapter": str(args.adapter)}))
    return 0
