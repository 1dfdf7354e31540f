#!/usr/bin/env python3
"""Benchmark: prefill of issue 22's new families against the Llama-convention block of the same size, one run.

Builds seeded checkpoints (transformers ``save_pretrained``, random initialisation) of each new family at its real
geometry ratios scaled to hidden 1024 (ModernBERT-base: 64-wide heads, multi-head, a ±64-token local window; LFM3:
128-wide heads, 4 query heads per kv head, a 256-token window, proportional half-rotary full layers, the per-head
gate; Gemma 4's default text config: 256-wide heads, 2 query heads per kv head, 512-wide full-layer heads with
proportional RoPE, a 512-token window; MiMo-V2-Flash: 16 heads of 192 with 128-wide values (H·Dv = 2E, as 64 of 128
at hidden 4096), 1 kv head on full layers and 2 with sinks on sliding ones, a 129-token window, RoPE on 64 of 192
features) and of a Llama with each geometry, exports one layer of each kind
(``posenc export --hf-model``), optimizes it for ONNX Runtime CPU (``posenc optimize --target ort-cpu``), and times
every graph in one ``posenc bench`` run, so the ratios compare graphs measured in the same rounds on the same
machine. Optionally builds TensorRT-RTX engines
ahead of time (``posenc optimize --target trt``, ``posenc build --engine-target sm89``) in both table modes.

    python scripts/bench_new_families.py --workdir /tmp/bench22 [--engines] [--layers gemma4-full,llama-4x256-gqa2]
    python scripts/bench_new_families.py --workdir /tmp/bench22 --decode [--cache-capacity 4096]

``--decode`` exports each layer with the in-place cache (``--kv-cache inplace``: a sliding layer's ring of
``W + 15`` slots, a full layer's cache of the context, or ``--cache-capacity`` slots) and times one decode step at
past 4095 (``--shape decode:1,1,4095``) against its bytes floor.

This is a benchmark, not a test: its numbers go into notes, never into assertions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONTEXT = 8192
MODERNBERT = {"hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 1536, "num_hidden_layers": 3,
              "vocab_size": 128, "max_position_embeddings": CONTEXT, "local_attention": 128,
              "global_attn_every_n_layers": 3, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
              "cls_token_id": 1, "sep_token_id": 2}  # fmt: skip
LFM3 = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
        "intermediate_size": 1024, "num_hidden_layers": 3, "vocab_size": 128, "max_position_embeddings": CONTEXT,
        "sliding_window": 256, "layer_types": ["conv", "sliding_attention", "full_attention"],
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
GEMMA4 = {"hidden_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
          "global_head_dim": 512, "intermediate_size": 1024, "num_hidden_layers": 2, "vocab_size": 128,
          "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 64, "max_position_embeddings": CONTEXT,
          "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"], "pad_token_id": 0,
          "bos_token_id": 1, "eos_token_id": 1}  # fmt: skip
MIMO = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 1, "head_dim": 192, "v_head_dim": 128,
        "intermediate_size": 1024, "moe_intermediate_size": 256, "n_routed_experts": 2, "num_experts_per_tok": 1,
        "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": CONTEXT, "sliding_window": 129,
        "layer_types": ["full_attention", "sliding_attention"], "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None}  # fmt: skip
LLAMA = {"intermediate_size": 1024, "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": CONTEXT}

CHECKPOINTS = {
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM", MODERNBERT),
    "lfm3": ("Lfm3Config", "Lfm3ForCausalLM", LFM3),
    "llama-16x64": ("LlamaConfig", "LlamaForCausalLM", {**LLAMA, "hidden_size": 1024, "num_attention_heads": 16,
                                                         "num_key_value_heads": 16}),
    "llama-8x128-gqa2": ("LlamaConfig", "LlamaForCausalLM", {**LLAMA, "hidden_size": 1024, "num_attention_heads": 8,
                                                              "num_key_value_heads": 2}),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", GEMMA4),
    "llama-4x256-gqa2": ("LlamaConfig", "LlamaForCausalLM", {**LLAMA, "hidden_size": 1024, "num_attention_heads": 4,
                                                              "num_key_value_heads": 2, "head_dim": 256}),
    "llama-4x512-gqa2": ("LlamaConfig", "LlamaForCausalLM", {**LLAMA, "hidden_size": 1024, "num_attention_heads": 4,
                                                              "num_key_value_heads": 2, "head_dim": 512}),
    "mimo": ("MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", MIMO),
    "llama-16x192-gqa8": ("LlamaConfig", "LlamaForCausalLM", {**LLAMA, "hidden_size": 1024, "num_attention_heads": 16,
                                                               "num_key_value_heads": 2, "head_dim": 192}),
}  # fmt: skip
LAYERS = {
    "modernbert-global": ("modernbert", 0),
    "modernbert-local": ("modernbert", 1),
    "lfm3-sliding": ("lfm3", 1),
    "lfm3-full": ("lfm3", 2),
    "llama-16x64": ("llama-16x64", 1),
    "llama-8x128-gqa2": ("llama-8x128-gqa2", 1),
    "gemma4-sliding": ("gemma4", 0),
    "gemma4-full": ("gemma4", 1),
    "llama-4x256-gqa2": ("llama-4x256-gqa2", 1),
    "llama-4x512-gqa2": ("llama-4x512-gqa2", 1),
    "mimo-full": ("mimo", 0),
    "mimo-sliding": ("mimo", 1),
    "llama-16x192-gqa8": ("llama-16x192-gqa8", 1),
}
"""graph name -> (checkpoint, layer)."""


def posenc(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "posenc.cli", *args], check=True)


def build(workdir: Path, names: set[str]) -> None:
    import transformers

    from posenc.checkpoints.samples import save_seeded

    for name, (config_class, model_class, settings) in CHECKPOINTS.items():
        if name not in names:
            continue
        folder = workdir / "ckpt" / name
        if not (folder / "config.json").exists():
            config = getattr(transformers, config_class)(**settings)
            save_seeded(getattr(transformers, model_class), config, folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("bench-new-families"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--engines", action="store_true", help="also build sm89 engines with TensorRT-RTX")
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated graph names (default: all)")
    parser.add_argument("--decode", action="store_true", help="in-place cache graphs, one decode step at past 4095")
    parser.add_argument("--cache-capacity", type=int, default=None, help="in-place cache slots (with --decode)")
    args = parser.parse_args()
    layout = ["--kv-cache", "inplace"] if args.decode else []
    if args.decode and args.cache_capacity:
        layout += ["--cache-capacity", str(args.cache_capacity)]
    tag = ("-inplace" + (f"{args.cache_capacity}" if args.cache_capacity else "")) if args.decode else ""
    chosen = {name: LAYERS[name] for name in args.layers.split(",")}
    build(args.workdir, {checkpoint for checkpoint, _ in chosen.values()})
    graphs = []
    for name, (checkpoint, layer) in chosen.items():
        for mode in ("precomputed", "dynamic") if args.engines else ("precomputed",):
            exported = args.workdir / "onnx" / f"{name}-{mode}{tag}.onnx"
            if not exported.exists():
                posenc("export", "--hf-model", str(args.workdir / "ckpt" / checkpoint), "--layer", str(layer),
                       "--table-mode", mode, *layout, "-o", str(exported))  # fmt: skip
            fused = exported.with_suffix(".ort-cpu.onnx")
            if not fused.exists():
                posenc("optimize", str(exported), "--target", "ort-cpu", "-o", str(fused))
            if mode == "precomputed":
                graphs.append(str(fused))
            if args.engines:
                trt = exported.with_suffix(".trt.onnx")
                if not trt.exists():
                    posenc("optimize", str(exported), "--target", "trt", "-o", str(trt))
                posenc("build", str(trt), "--engine-target", "sm89", "-o", str(trt.with_suffix(".sm89.engine")))
    shape = "decode:1,1,4095" if args.decode else "prefill"
    out = args.workdir / f"bench{tag}"
    bench = ["bench", *graphs, "--shape", shape, "--backend", "ort-cpu", "--repeats", str(args.repeats),
             "--no-plots", "-o", str(out)]  # fmt: skip
    if args.threads:
        bench += ["--threads", str(args.threads)]
    posenc(*bench)
    print(json.dumps({"bench": str(out / "bench.md")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
