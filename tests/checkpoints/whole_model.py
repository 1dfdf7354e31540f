"""Run a whole transformers model and record what one attention module of it saw and returned.

A checkpoint family's reference (posenc.checkpoints.reference) calls the transformers attention module itself; if
it called the module differently from the model (another mask, cache layout, position embeddings, bias), every
parity claim against it would be hollow. These helpers capture the module's input and output while the model runs
a prompt and then one decode step, so tests can hold each reference to the model as a whole.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ATTENTION_OF: dict[str, Callable[[Any, int, str | None], torch.nn.Module]] = {
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"),
        lambda model, layer, stack: model.layers[layer].self_attn,
    ),
    **dict.fromkeys(
        (
            "llama4_text",
            "deepseek_v2",
            "deepseek_v3",
            "hunyuan_v1_dense",
            "mistral4",
            "qwen3_next",
            "gemma4_text",
            "mimo_v2_flash",
        ),
        lambda model, layer, stack: model.layers[layer].self_attn,
    ),
    **dict.fromkeys(
        ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"),
        lambda model, layer, stack: model.language_model.layers[layer].self_attn,
    ),
    "gptj": lambda model, layer, stack: model.h[layer].attn,
    "gpt_neox": lambda model, layer, stack: model.layers[layer].attention,
    "falcon": lambda model, layer, stack: model.h[layer].self_attention,
    "bloom": lambda model, layer, stack: model.h[layer].self_attention,
    "mpt": lambda model, layer, stack: model.blocks[layer].attn,
    "modernbert": lambda model, layer, stack: model.layers[layer].attn,
    **dict.fromkeys(
        ("t5", "mt5"),
        lambda model, layer, stack: getattr(model, stack or "encoder").block[layer].layer[0].SelfAttention,
    ),
}
"""model_type -> where the base model (``AutoModel``) keeps the attention module of a layer."""

Calls = list[tuple[torch.Tensor, torch.Tensor]]


def capture(module: torch.nn.Module) -> tuple[Calls, Any]:
    """Record ``(hidden input, output)`` of every call of an attention module (BLOOM's residual subtracted)."""
    calls: Calls = []

    def hook(mod: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        out = output[0]
        residual = args[1] if len(args) > 1 and type(mod).__name__ == "BloomAttention" else None
        calls.append((hidden.detach().clone(), (out - residual if residual is not None else out).detach().clone()))

    return calls, module.register_forward_hook(hook, with_kwargs=True)


def model_steps(
    folder: Path, layer: int, stack: str | None, implementation: str = "eager", path: str | None = None
) -> Calls:
    """The layer's attention inputs and outputs while the base model runs a 6-token prompt, then (for decoder
    stacks) one more token with the cache; encoder stacks and models that return no cache run the 6 tokens once.
    ``path``: the attention module's name in the base model (default: from :data:`ATTENTION_OF`)."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder, attn_implementation=implementation).eval()
    attention = model.get_submodule(path) if path else ATTENTION_OF[model.config.model_type](model, layer, stack)
    calls, handle = capture(attention)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            encoded = model.get_encoder()(ids[:, :6])
            if stack == "decoder":
                past = model(encoder_outputs=encoded, decoder_input_ids=ids[:, :6], use_cache=True).past_key_values
                model(encoder_outputs=encoded, decoder_input_ids=ids[:, 6:], past_key_values=past, use_cache=True)
        else:
            past = getattr(model(ids[:, :6], use_cache=True), "past_key_values", None)
            if past is not None:  # an encoder (ModernBERT) returns no cache: the prompt is its one call
                model(ids[:, 6:], past_key_values=past, use_cache=True)
    handle.remove()
    return calls


def reference_error(reference: Callable[..., tuple[torch.Tensor, ...]], steps: Calls) -> float:
    """Largest |reference - model| over the prompt and, when there is one, the decode step (the reference carries
    its own cache from the prompt to the step)."""
    (prompt, prompt_out), *rest = steps
    out, key, value = reference(prompt, torch.arange(6).expand(2, 6))
    errors = [float((out - prompt_out).abs().max())]
    for token, token_out in rest:
        errors.append(float((reference(token, torch.full((2, 1), 6), key, value)[0] - token_out).abs().max()))
    return max(errors)
