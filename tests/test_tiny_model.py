from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image


def _frame(side: int = 80) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_tiny_model_loads_with_its_processor_and_sees_25_tokens_per_80px_frame(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Moves left: 3."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[Image.open(io.BytesIO(_frame()))], return_tensors="pt")
    image_token_id = model.config.image_token_id
    assert int((batch["input_ids"] == image_token_id).sum()) == 25
    assert batch["image_grid_thw"].tolist() == [[1, 10, 10]]
    logits = model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(logits).all()


def test_tiny_model_has_qwen_special_tokens_and_a_small_parameter_count(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for token in ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"):
        assert tokenizer.convert_tokens_to_ids(token) is not None
        assert tokenizer.convert_tokens_to_ids(token) != tokenizer.unk_token_id
    for action in ("up", "down", "left", "right", "stop"):
        assert tokenizer.decode(tokenizer.encode(action)) == action
    info = json.loads((tiny_model_dir / "mmrl_model.json").read_text())
    assert 300_000 <= info["num_parameters"] <= 5_000_000
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["text_config"]["head_dim"] >= 32


def test_init_model_cli_sizes_the_text_model_and_rejects_bad_sizes(tmp_path: Path, capsys) -> None:
    from mmrl.models.tiny import build_tiny_model, main

    out = tmp_path / "wide"
    assert main(["tiny", "--out", str(out), "--hidden-size", "192", "--layers", "2"]) == 0
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert (text["hidden_size"], text["num_hidden_layers"]) == (192, 2)
    assert (text["num_attention_heads"], text["num_key_value_heads"]) == (6, 3)
    assert "parameters" in capsys.readouterr().out
    for bad in (["--hidden-size", "100"], ["--hidden-size", "0"], ["--layers", "0"]):
        with pytest.raises(SystemExit):
            main(["tiny", "--out", str(tmp_path / "bad"), *bad])
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="multiple of 64"):
        build_tiny_model(tmp_path / "bad", hidden_size=96)
    assert not (tmp_path / "bad").exists()
