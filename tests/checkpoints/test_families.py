"""Every checkpoint family, proven against the checkpoint's own transformers module (see tests/checkpoints/parity.py).

Each case builds a tiny seeded checkpoint with transformers' config and model classes (``save_pretrained``), exports
one layer with ``posenc export --hf-model``, and compares ONNX Runtime's output with transformers' module at short
positions, decode steps with a cache, and positions near the context length, in both table modes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoints import tiny
from tests.checkpoints.parity import Case, check_case

pytest.importorskip("transformers")

LONG_CONTEXT = 32768
"""Rotary decoders get a long context so positions near it show transformers' own float32 angle error."""


def _llama(folder: Path) -> Case:
    return Case(tiny.llama(folder, max_position_embeddings=LONG_CONTEXT), layer=1)


def _llama_scaled(folder: Path) -> Case:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 4096}  # fmt: skip
    return Case(tiny.llama(folder, max_position_embeddings=LONG_CONTEXT, rope_parameters=rope), layer=2)


def _qwen2_yarn(folder: Path) -> Case:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    rope = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 8192}
    config = Qwen2Config(**{**tiny.TINY, "max_position_embeddings": LONG_CONTEXT, "rope_parameters": rope})
    return Case(tiny.save_tiny(Qwen2ForCausalLM, config, folder), layer=0)


def _llama_biases(folder: Path) -> Case:
    return Case(tiny.llama(folder, max_position_embeddings=LONG_CONTEXT, attention_bias=True), layer=0)


def _mistral_window(folder: Path) -> Case:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(**{**tiny.TINY, "max_position_embeddings": LONG_CONTEXT, "sliding_window": 6})
    return Case(tiny.save_tiny(MistralForCausalLM, config, folder), layer=2)


def _qwen3_norms(folder: Path) -> Case:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{**tiny.TINY, "head_dim": 16, "max_position_embeddings": LONG_CONTEXT})
    return Case(tiny.save_tiny(Qwen3ForCausalLM, config, folder), layer=1)


def _gemma(version: str, layer: int | None, layer_type: str | None = None) -> Callable[[Path], Case]:
    def build(folder: Path) -> Case:
        import transformers

        config_class, model_class = {
            "1": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
            "2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
            "3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        }[version]
        extra = {"head_dim": 16, "max_position_embeddings": LONG_CONTEXT, "num_hidden_layers": 4}
        if version != "1":
            extra.update(sliding_window=5, query_pre_attn_scalar=24)
        if version == "3":
            rope = {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0},
            }
            extra.update(sliding_window_pattern=2, attn_logit_softcapping=30.0, rope_parameters=rope)
        config = config_class(**{**tiny.TINY, **extra})
        return Case(tiny.save_tiny(model_class, config, folder), layer=layer, layer_type=layer_type)

    return build


def _gptj(folder: Path) -> Case:
    from transformers import GPTJConfig, GPTJForCausalLM

    config = GPTJConfig(n_embd=64, n_head=4, n_layer=2, rotary_dim=8, vocab_size=96, n_positions=LONG_CONTEXT,
                        bos_token_id=None, eos_token_id=None)  # fmt: skip
    return Case(tiny.save_tiny(GPTJForCausalLM, config, folder), layer=1)


def _phi3_longrope(folder: Path) -> Case:
    from transformers import Phi3Config, Phi3ForCausalLM

    half = int(16 * 0.75) // 2  # rotary dim 12 of head_dim 16
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": 4096, "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [1.0 + 2.0 * i for i in range(half)]}  # fmt: skip
    config = Phi3Config(**{**tiny.TINY, "max_position_embeddings": LONG_CONTEXT, "rope_parameters": rope,
                           "pad_token_id": None, "bos_token_id": None, "eos_token_id": None})  # fmt: skip
    return Case(tiny.save_tiny(Phi3ForCausalLM, config, folder), layer=1)


def _t5(stack: str, layer: int) -> Callable[[Path], Case]:
    def build(folder: Path) -> Case:
        from transformers import T5Config, T5ForConditionalGeneration

        buckets = {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 20}
        config = T5Config(d_model=64, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4, vocab_size=96,
                          **buckets)  # fmt: skip
        return Case(tiny.save_tiny(T5ForConditionalGeneration, config, folder), layer=layer, layer_type=stack)

    return build


CASES: dict[str, Callable[[Path], Case]] = {
    "llama": _llama,
    "llama3-scaling": _llama_scaled,
    "qwen2-yarn-qkv-bias": _qwen2_yarn,
    "llama-attention-bias": _llama_biases,
    "mistral-sliding-window": _mistral_window,
    "qwen3-qk-norm": _qwen3_norms,
    "gemma": _gemma("1", 1),
    "gemma2-softcap-sliding": _gemma("2", 0),
    "gemma2-full": _gemma("2", 1),
    "gemma3-sliding": _gemma("3", None, "sliding_attention"),
    "gemma3-full-linear": _gemma("3", None, "full_attention"),
    "gptj-interleaved-partial": _gptj,
    "phi3-longrope-partial-fused-qkv": _phi3_longrope,
    "t5-encoder-layer1": _t5("encoder", 1),
    "t5-decoder-layer2": _t5("decoder", 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_family_layer_matches_its_transformers_module(name: str, tmp_path: Path) -> None:
    case = CASES[name](tmp_path / "ckpt")
    measured: Any = check_case(case, tmp_path)
    assert measured  # check_case asserts every claim; the errors are returned for debugging
