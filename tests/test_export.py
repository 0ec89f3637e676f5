"""`mmrl export --merge`: an adapter the learner published, folded into its base, loads as a plain HF
model whose log-probs are those of base + adapter (transformers here; vLLM in the slow test)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mmrl.cli.export import main as export_main
from services.common.training import TrainSettings
from services.learner.policy import add_lora, load_base_model, token_logprobs, trainable_parameters
from services.learner.publish import publish_adapter


def published_adapter(base: Path, shared_root: Path) -> Path:
    """A published adapter version whose B matrices are random (a fresh adapter is the identity)."""
    model = add_lora(load_base_model(base), TrainSettings(seed=0))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in trainable_parameters(model):
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    state = {name: param.detach() for name, param in trainable_parameters(model)}
    return publish_adapter(shared_root, "run", 1, state, model.peft_config["default"],
                           extra_manifest={"base_model": str(base)}).path


def maze_batch(model_dir: Path) -> Any:
    """Two-turn maze conversations with images, as a collated learner batch."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    from mmrl.bench.synthetic import fake_generator, play_episodes
    from services.common.conversation import ChatTokens
    from services.learner.batch import FrameProcessor, ModelSpec, collate, prepare_batch

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generate = fake_generator(ChatTokens.from_tokenizer(tokenizer), tokenizer, tokens_per_image=25)
    played = play_episodes(generate, tokenizer, num_groups=2, group_size=2, num_turns=2)
    spec = ModelSpec.from_config(AutoConfig.from_pretrained(model_dir))
    frames = FrameProcessor(AutoProcessor.from_pretrained(model_dir).image_processor)
    return collate(prepare_batch(played, spec, frames), spec.pad_token_id, spec.image_token_id)


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return published_adapter(tiny_model_dir, tmp_path_factory.mktemp("shared"))


@pytest.fixture(scope="module")
def merged(adapter: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "merged"
    assert export_main(["--adapter", str(adapter), "--merge", "--out", str(out)]) == 0
    return out


def test_a_merged_export_loads_in_transformers_with_the_log_probs_of_base_plus_adapter(
    merged: Path, adapter: Path, tiny_model_dir: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoProcessor

    batch = maze_batch(tiny_model_dir)
    mask = batch.loss_mask.bool()
    with torch.no_grad():
        exported, _ = token_logprobs(load_base_model(merged), batch, "cpu")
        with_adapter = PeftModel.from_pretrained(load_base_model(tiny_model_dir), str(adapter))
        expected, _ = token_logprobs(with_adapter, batch, "cpu")
        base, _ = token_logprobs(load_base_model(tiny_model_dir), batch, "cpu")
    diff = (exported - expected)[mask].abs().max().item()
    effect = (base - expected)[mask].abs().max().item()
    print(f"\nmerged vs base+adapter max |dlogp| {diff:.2e}; adapter effect {effect:.2e}")
    assert diff <= 1e-5
    assert effect > 1e-3  # the adapter changes the model, so the comparison means something
    processor = AutoProcessor.from_pretrained(merged)
    assert processor.tokenizer.get_vocab() == AutoProcessor.from_pretrained(tiny_model_dir).tokenizer.get_vocab()
    assert processor.chat_template
    assert not any(p.name.startswith("adapter_") for p in merged.iterdir())  # a plain model, no adapter files
    record = json.loads((merged / "mmrl_export.json").read_text())
    assert record["base_model"] == str(tiny_model_dir.resolve()) and record["dtype"] == "float32"


def test_export_refuses_an_existing_output_a_directory_without_an_adapter_and_an_unknown_base(
    merged: Path, adapter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        export_main(["--adapter", str(adapter), "--merge", "--out", str(merged)])
    assert exited.value.code == 1 and "exists (use --force" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export_main(["--adapter", str(tmp_path), "--merge", "--out", str(tmp_path / "out")])
    assert "is not a LoRA adapter" in capsys.readouterr().err
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (copy / name).write_bytes((adapter / name).read_bytes())
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "Qwen/x"}))
    with pytest.raises(SystemExit):
        export_main(["--adapter", str(copy), "--merge", "--out", str(tmp_path / "out")])
    assert "pass --base-model" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_vllm_serves_the_merged_export_with_the_log_probs_of_the_adapter_on_the_base(
    merged: Path, adapter: Path, tiny_model_dir: Path
) -> None:
    """One engine at a time: the base with the adapter as a LoRARequest (as the rollout service
    serves it) samples; then the merged model in a stock engine without LoRA scores those tokens."""
    import io

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from mmrl.bench.synthetic import maze_frame

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    from PIL import Image

    image = Image.open(io.BytesIO(maze_frame(7)))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Moves left: 5."}]}],
        add_generation_prompt=True, tokenize=False,
    )
    prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    text_ids = sorted(set(range(len(tokenizer))) - set(tokenizer.all_special_ids))
    common = {"dtype": "float32", "max_model_len": 1024, "gpu_memory_utilization": 0.1,
              "limit_mm_per_prompt": {"image": 1}, "seed": 0, "enable_chunked_prefill": False}

    def run(model: Path, params: Any, lora: Any = None, **extra: Any) -> Any:
        llm = LLM(model=str(model), **common, **extra)
        try:
            request = {"prompt_token_ids": prompt_ids, "multi_modal_data": {"image": [image]}}
            return llm.generate([request], params, lora_request=lora, use_tqdm=False)[0]
        finally:
            del llm
            gc.collect()

    prompt_ids = prompt
    sampled = run(tiny_model_dir, SamplingParams(temperature=1.0, max_tokens=6, logprobs=0, seed=0,
                                                 allowed_token_ids=text_ids),
                  LoRARequest("run-v1", 1, str(adapter)), enable_lora=True, max_lora_rank=16)
    tokens = list(sampled.outputs[0].token_ids)
    served = [step[t].logprob for t, step in zip(tokens, sampled.outputs[0].logprobs, strict=True)]
    num_expanded = len(sampled.prompt_token_ids)
    prompt_ids = prompt + tokens
    scored = run(merged, SamplingParams(max_tokens=1, prompt_logprobs=0))
    exported = [step[t].logprob for t, step in zip(tokens, scored.prompt_logprobs[num_expanded:], strict=True)]
    diff = max(abs(a - b) for a, b in zip(served, exported, strict=True))
    print(f"\nvLLM merged vs base + LoRARequest max |dlogp| over {len(tokens)} tokens: {diff:.2e}")
    assert diff <= 1e-4
