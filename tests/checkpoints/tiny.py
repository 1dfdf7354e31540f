"""Tiny seeded transformers checkpoints, built locally with transformers' own config classes (never downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "max_position_embeddings": 256,
}
"""Geometry shared by the decoder checkpoints: head_dim 16, grouped-query 4/2 heads, 256 positions."""


def save_tiny(model_class: Any, config: Any, folder: Path, *, seed: int = 0, shard: str | None = "40KB") -> Path:
    """``model_class(config)`` with seeded weights (biases and norms perturbed too), saved to ``folder``.

    Default initialisations leave biases at zero and norm weights at one, which would hide a missing bias or
    norm; every floating tensor gets a small seeded perturbation so each one matters.
    """
    torch.manual_seed(seed)
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.05 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    model.save_pretrained(folder, max_shard_size=shard) if shard else model.save_pretrained(folder)
    return folder


def llama(folder: Path, **overrides: Any) -> Path:
    """A sharded 3-layer Llama checkpoint (``overrides`` go to ``LlamaConfig``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return save_tiny(LlamaForCausalLM, LlamaConfig(**{**TINY, **overrides}), folder)
