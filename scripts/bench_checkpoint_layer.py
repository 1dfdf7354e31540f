#!/usr/bin/env python3
"""Benchmark: export one layer of a sharded checkpoint many times larger than that layer; peak memory and time.

Builds (once, in --workdir) a Llama-shaped checkpoint with transformers' ``LlamaConfig`` and random safetensors
shards (one shard per layer, written tensor by tensor so building it never holds the model), then runs
``posenc export --hf-model DIR --layer L`` in fresh processes and reports each one's peak resident memory and
wall time, next to the same export with random weights (``--scheme`` with the same geometry: the floor that
importing torch/onnx and exporting costs). The difference is what reading the checkpoint costs.

    python scripts/bench_checkpoint_layer.py --layers 16 --hidden 1024 --repeats 3

This is a benchmark, not a test: its numbers go into notes, never into assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import resource, sys, time
from posenc.cli import main
start = time.perf_counter()
status = main(sys.argv[1:])
seconds = time.perf_counter() - start
print("RESULT", status, seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def build_checkpoint(folder: Path, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    """Write config.json and one safetensors shard per layer (plus embeddings) with an index; returns bytes."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    folder.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=4096,
    )
    config.save_pretrained(folder)
    head_dim = hidden // heads
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    weight_map: dict[str, str] = {}
    total = 0
    shards = layers + 1
    for index in range(shards):
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        if index == layers:
            tensors = {
                "model.embed_tokens.weight": rand(vocab, hidden),
                "lm_head.weight": rand(vocab, hidden),
                "model.norm.weight": torch.ones(hidden),
            }
        else:
            p = f"model.layers.{index}."
            tensors = {
                p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
                p + "mlp.gate_proj.weight": rand(ffn, hidden),
                p + "mlp.up_proj.weight": rand(ffn, hidden),
                p + "mlp.down_proj.weight": rand(hidden, ffn),
                p + "input_layernorm.weight": torch.ones(hidden),
                p + "post_attention_layernorm.weight": torch.ones(hidden),
            }
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, name))
    index_data = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_data, indent=2))
    return total


def run_export(args: list[str]) -> tuple[float, int]:
    """``(seconds, peak RSS in bytes)`` of one ``posenc export`` in a fresh process."""
    result = subprocess.run([sys.executable, "-c", CHILD, "export", *args], capture_output=True, text=True, check=False)
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None or line.split()[1] != "0":
        raise SystemExit(f"export failed:\n{result.stdout}\n{result.stderr}")
    _, _, seconds, kib = line.split()
    return float(seconds), int(kib) * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("bench-results/checkpoint"))
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--layer", type=int, default=None, help="layer to export (default: the last)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = args.workdir / "llama"
    if not (folder / "model.safetensors.index.json").exists():
        start = time.perf_counter()
        size = build_checkpoint(folder, args.layers, args.hidden, args.heads, args.kv_heads, args.ffn, args.vocab)
        print(f"built {folder}: {size / 2**20:.0f} MiB in {time.perf_counter() - start:.1f} s")
    size = json.loads((folder / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    layer = args.layers - 1 if args.layer is None else args.layer
    head_dim = args.hidden // args.heads
    attention = 4 * (2 * args.hidden * args.heads * head_dim + 2 * args.hidden * args.kv_heads * head_dim)
    checkpoint = ["--hf-model", str(folder), "--layer", str(layer), "-o", str(args.workdir / "layer.onnx")]
    floor = [
        "--scheme", "rope", "--hidden-size", str(args.hidden), "--num-heads", str(args.heads),
        "--num-kv-heads", str(args.kv_heads), "--max-position-embeddings", "4096",
        "-o", str(args.workdir / "random.onnx"),
    ]  # fmt: skip
    rows = {"checkpoint layer": [run_export(checkpoint) for _ in range(args.repeats)]}
    rows["random weights (floor)"] = [run_export(floor) for _ in range(args.repeats)]
    print(f"checkpoint: {size / 2**20:.0f} MiB in {args.layers + 1} shards; layer {layer}'s attention: "
          f"{attention / 2**20:.1f} MiB ({size / attention:.0f}x smaller than the checkpoint)")  # fmt: skip
    print("| export | median s | peak RSS MiB (median of runs) |")
    print("|---|---:|---:|")
    for name, runs in rows.items():
        seconds = statistics.median(r[0] for r in runs)
        peak = statistics.median(r[1] for r in runs)
        print(f"| {name} | {seconds:.2f} | {peak / 2**20:.0f} |")
    extra = statistics.median(r[1] for r in rows["checkpoint layer"]) - statistics.median(
        r[1] for r in rows["random weights (floor)"]
    )
    print(f"reading the checkpoint layer cost {extra / 2**20:+.0f} MiB of peak memory over the floor "
          f"(the checkpoint is {size / 2**20:.0f} MiB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
