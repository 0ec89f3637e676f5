"""`mmrl init-model tiny --out DIR`: a small random-initialised Qwen3-VL model for machines that
cannot download weights.

The result is a standard Hugging Face directory (config, safetensors weights, tokenizer, image and
video processors, chat template) that vLLM, transformers and peft load like any Qwen3-VL
checkpoint. Nothing in the services depends on it: they read sizes and token ids from whatever
model directory they are given.

Shape by default (about 1.0M parameters): text hidden 128, 4 layers, 4 query / 2 key-value heads
of head_dim 32 (vLLM's CPU attention rejects 16), vision tower of depth 2 with patch 8 and merge 2,
so an 80x80 frame becomes 25 image tokens. `--hidden-size` and `--layers` size the text model
(heads follow the hidden size); the vision tower stays as it is. The tokenizer is a byte-level BPE
trained locally on the default prompt text and every registered environment's action words, with
Qwen's special tokens, so every string is encodable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from services.common.messages import summary
from services.env import registry

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen-style chat template (text and image parts); used by processor.apply_chat_template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The default system prompt's words and the maze's feedback (the reference task's text); each registered
# environment adds its action words (`action_words`).
_WORDS = (
    "You are a maze solving agent. The image shows a maze. Walls are dark, the floor is light, "
    "you are the red square and the goal is the green square. Reach the goal. Reply with one "
    "move: up, down, left, right or stop. Moves left: You hit a wall. Invalid action. "
    "You reached the goal. You stopped. Out of moves. The answer is <answer> </answer> "
    "system user assistant move moves turn step action"
)


def action_words() -> list[str]:
    """Every registered environment's action words, each once, in registry order."""
    words: dict[str, None] = {}
    for environment in registry.ENVIRONMENTS.values():
        info = getattr(environment, "INFO", None)
        words.update(dict.fromkeys(info.actions if info is not None else ()))
    return list(words)


def _training_corpus() -> list[str]:
    actions = action_words()
    lines = [_WORDS, *actions]
    lines += [f"{a}\n" for a in actions]
    lines += [f"Moves left: {n}." for n in range(0, 101)]
    lines += [f"Invalid action '{a}'." for a in ("go north", "jump", "xyz", "UP!!")]
    lines += [f"<answer>{a}</answer>" for a in actions]
    lines += [" ".join(str(i) for i in range(100))]
    return lines * 4


def build_tokenizer(vocab_size: int = 512):  # -> PreTrainedTokenizerFast
    """Byte-level BPE over maze text plus Qwen's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


HEAD_DIM = 32


def check_text_shape(hidden_size: int, num_layers: int) -> None:
    """The text model's heads are hidden_size / 32 queries sharing key-value heads in pairs, so the
    hidden size must be a positive multiple of 64."""
    if hidden_size < 2 * HEAD_DIM or hidden_size % (2 * HEAD_DIM):
        raise ValueError(f"hidden size {hidden_size}: must be a positive multiple of {2 * HEAD_DIM} "
                         f"(head_dim {HEAD_DIM}, 2 query heads per key-value head)")
    if num_layers < 1:
        raise ValueError(f"{num_layers} layers: at least 1 is needed")


def qwen3_vl_config(
    tokenizer, hidden_size: int = 128, num_layers: int = 4, intermediate_size: int | None = None,
    num_kv_heads: int | None = None, head_dim: int = HEAD_DIM, vocab_size: int | None = None,
):  # -> Qwen3VLConfig
    """The tiny model's configuration (text model sized by the arguments, the small vision tower),
    with the special-token ids of `tokenizer`. Defaults: intermediate 2 x hidden, key-value heads
    half the query heads, the tokenizer's vocabulary."""
    from transformers import Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    num_heads = hidden_size // head_dim
    spatial = 5 * head_dim // 32  # mrope sections (t, h, w) split head_dim / 2 rotary frequencies
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": vocab_size or len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size or hidden_size * 2,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads or num_heads // 2,
            "head_dim": head_dim,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [head_dim // 2 - 2 * spatial, spatial, spatial],
                                "mrope_interleaved": True},
            "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"],
        },
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": 8,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden_size,
            "num_position_embeddings": 256,
            "deepstack_visual_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    return config


def tiny_processor(tokenizer):  # -> Qwen3VLProcessor
    """The tiny model's processor: Qwen's image and video processors at 8-pixel patches, `tokenizer`,
    the chat template."""
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    size = {"shortest_edge": 16 * 16, "longest_edge": 256 * 256}
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=8, merge_size=2, temporal_patch_size=2, size=size),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(patch_size=8, merge_size=2, temporal_patch_size=2, size=size),
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(out_dir: Path, seed: int = 0, hidden_size: int = 128, num_layers: int = 4) -> Path:
    """Writes a random-initialised tiny Qwen3-VL (weights, tokenizer, processor) into `out_dir`."""
    check_text_shape(hidden_size, num_layers)
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = qwen3_vl_config(tokenizer, hidden_size, num_layers)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).float()
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tiny_processor(tokenizer).save_pretrained(out_dir)
    num_params = sum(p.numel() for p in model.parameters())
    (out_dir / "mmrl_model.json").write_text(
        json.dumps({"kind": "tiny", "seed": seed, "num_parameters": num_params}, indent=2)
    )
    return out_dir


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mmrl init-model", description=summary(__doc__))
    parser.add_argument("kind", choices=["tiny"], help="model to build (only 'tiny' is built locally)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed")
    parser.add_argument("--force", action="store_true", help="rebuild even if DIR/config.json exists")
    parser.add_argument("--hidden-size", type=int, default=128,
                        help="text hidden size, a positive multiple of 64 (default 128)")
    parser.add_argument("--layers", type=int, default=4, help="text decoder layers (default 4)")
    args = parser.parse_args(argv)
    try:
        check_text_shape(args.hidden_size, args.layers)
    except ValueError as exc:
        parser.error(str(exc))
    if (args.out / "config.json").is_file() and not args.force:
        print(f"{args.out} already holds a model (use --force to rebuild)")
        return 0
    build_tiny_model(args.out, seed=args.seed, hidden_size=args.hidden_size, num_layers=args.layers)
    info = json.loads((args.out / "mmrl_model.json").read_text())
    print(f"wrote tiny Qwen3-VL ({info['num_parameters']:,} parameters) to {args.out}")
    return 0
