"""The policy: a Hugging Face vision-language model with a peft LoRA adapter, and its per-token
log-probs and entropies on a `PolicyBatch`.

The reference policy for the KL term is the same model with the adapter disabled (no second copy
of the weights): `reference_logprobs`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from services.common.storage import is_vision_module
from services.learner.batch import PolicyBatch

if TYPE_CHECKING:  # pydantic is not needed to train (the GPU check runs without it)
    from services.common.training import TrainSettings

ADAPTER_NAME = "default"


def load_base_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> Any:
    """Loads any HF image-text-to-text checkpoint (Qwen3-VL first), frozen, in eval mode (no
    dropout in the base model; LoRA dropout is switched on by `train()` on the adapter only)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype)
    model.requires_grad_(False)
    model.eval()
    return model


def load_processor(model_dir: Path) -> Any:
    """The model's HF processor (the same one the rollout engine uses)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


LINEAR = "Linear"


def module_kinds(model: Any) -> dict[str, str]:
    """Every named submodule of `model` -> LINEAR for a torch.nn.Linear, else its class name."""
    return {name: LINEAR if isinstance(module, torch.nn.Linear) else type(module).__name__
            for name, module in model.named_modules() if name}


def model_module_kinds(model_dir: Path) -> dict[str, str]:
    """`module_kinds` of the model in `model_dir`, from its config alone (built on the meta device)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(model_dir))
    return module_kinds(model)


def lora_targets(modules: dict[str, str], pattern: str) -> list[str]:
    """The layers `pattern` selects, as peft selects them (a full match of each module's name);
    ValueError when it is not a regex, selects nothing, or selects a module other than a linear layer
    (peft would adapt e.g. the vision tower's Conv3d patch embedding, which vLLM serves without it).
    Vision-tower layers may be among them: the rollout service serves such an adapter only when
    started with tower LoRA (services/rollout/config.py `tower_lora`). `modules`: `module_kinds`."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"lora.target_modules {pattern!r} is not a regular expression: {exc}") from exc
    matched = [name for name in modules if regex.fullmatch(name)]
    if not matched:
        raise ValueError(f"lora.target_modules {pattern!r} matches no linear layer")
    other = [name for name in matched if modules[name] != LINEAR]
    if other:
        raise ValueError(f"lora.target_modules {pattern!r} selects {other[0]!r}, a {modules[other[0]]}: "
                         "adapters are served on linear layers only")
    return matched


def adapts_vision(modules: dict[str, str], pattern: str) -> bool:
    """Whether `pattern` selects a layer of the vision tower or its mergers."""
    return any(is_vision_module(name) for name in lora_targets(modules, pattern))


def add_lora(model: Any, config: TrainSettings) -> Any:
    """Wraps `model` in a peft LoRA model on the modules matching `config.lora.target_modules`.

    The initialisation is seeded with `config.seed` (B = 0, so the adapter starts as the identity
    and every rank builds the same weights). Raises ValueError for targets `lora_targets` refuses.
    """
    from peft import LoraConfig, get_peft_model

    lora_targets(module_kinds(model), config.lora.target_modules)
    lora = LoraConfig(
        r=config.lora.rank,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        peft_model = get_peft_model(model, lora, adapter_name=ADAPTER_NAME)
    peft_model.eval()  # peft builds its dropout layers in training mode; the trainer switches them on
    if config.optim.activation_checkpointing:
        checkpoint_layers(peft_model)
    for name, param in peft_model.named_parameters():
        if param.requires_grad:
            assert "lora_" in name, f"only LoRA weights may train, not {name}"
            param.data = param.data.float()
    return peft_model


def trainable_parameters(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def checkpoint_layers(model: Any) -> None:
    """Turns on HF gradient checkpointing (non-reentrant) for every decoder and vision block. HF
    recomputes a block only when the block itself is in training mode, and the model stays in eval
    mode (no dropout in the base model), so only the blocks' own flags are set: their submodules,
    dropout included, stay in eval mode."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.training = True
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable layers for activation_checkpointing")


def token_logprobs(
    model: Any, batch: PolicyBatch, device: torch.device | str, with_entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the tokens at `batch.target_cols` under `model`, and the entropy of the
    next-token distribution there (detached unless `entropy_grad`, which an entropy bonus needs):

        logp[b, k] = log softmax(z[b, c_k - 1])[x[b, c_k]]       z: logits, x: input ids
        H[b, k]    = -sum_v p_v log p_v  of the same distribution

    Logits are computed only at the K needed positions and upcast to float32 before the softmax.
    With constrained actions (`batch.allowed`, services/common/constrained.py) both are of the
    distribution renormalised over the tokens allowed there:

        logp[b, k] = z[b, c_k - 1][x[b, c_k]] - logsumexp_{a in A[b, k]} z[b, c_k - 1][a]

    The model runs on the batch's distinct sequences (U rows) and each trajectory reads its row
    (`batch.rows`), so trajectories of the same sequence share one forward and the gradient sums
    their terms. Returns ([B, K], [B, K] or None); rows or columns that are not generated hold
    values for whatever token is there (the caller masks them).
    """
    positions = (batch.target_cols - 1).to(device)
    output = model(**batch.model_inputs(device), logits_to_keep=positions, use_cache=False)
    logits = output.logits.float()  # [U, K, V]
    targets = batch.input_ids.to(device)[:, batch.target_cols.to(device)]  # [U, K]
    if batch.allowed is not None:
        logprobs, entropy = _constrained_logprobs(logits, targets, batch.allowed.to(device), with_entropy,
                                                  entropy_grad)
    else:
        log_probs = torch.log_softmax(logits, dim=-1)
        logprobs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            scored = log_probs if entropy_grad else log_probs.detach()
            entropy = -(scored.exp() * scored).sum(-1)
    if batch.rows is None:
        return logprobs, entropy
    rows = batch.rows.to(device)
    return logprobs[rows], None if entropy is None else entropy[rows]


def _constrained_logprobs(logits: torch.Tensor, targets: torch.Tensor, allowed: torch.Tensor,
                          with_entropy: bool, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` over the allowed tokens only: logits [B, K, V], targets [B, K], allowed [B, K, A]."""
    valid = allowed >= 0
    z = logits.gather(-1, allowed.clamp(min=0)).masked_fill(~valid, float("-inf"))  # [B, K, A]
    log_norm = torch.logsumexp(z, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    entropy = None
    if with_entropy:
        log_p = z - log_norm.unsqueeze(-1)
        log_p = (log_p if entropy_grad else log_p.detach()).masked_fill(~valid, 0.0)
        entropy = -(log_p.exp() * log_p).sum(-1)  # 0 where not allowed: log_p is 0 there
    return logprobs, entropy


@torch.no_grad()
def reference_logprobs(model: Any, batch: PolicyBatch, device: torch.device | str) -> torch.Tensor:
    """`token_logprobs` of the reference policy: the same model with the adapter disabled."""
    with model.disable_adapter():
        logprobs, _ = token_logprobs(model, batch, device, with_entropy=False)
    return logprobs
