#!/usr/bin/env python3
"""Benchmark: a Llama checkpoint's layer exported ``--via trace`` vs its family export, both optimized for ort-cpu.

Builds (once, in --workdir) a one-layer Llama checkpoint with transformers' ``LlamaConfig`` (seeded weights,
``save_pretrained``), exports layer 0 both ways (``posenc export --hf-model DIR --via family`` and ``--via trace``),
optimizes both for ``ort-cpu`` (``posenc optimize``, with its before/after parity check), checks that the two
optimized graphs agree on the same feed, and times them on ONNX Runtime CPU in alternating rounds (one process, the
same threads, posenc.bench.timing.measure_interleaved) at a 512-token prefill and a decode step after 511 cached
tokens. Prints medians and the trace/family ratio. ``posenc bench`` times registered schemes, not a given ONNX file,
hence this script.

    python scripts/bench_trace_vs_family.py --hidden 2048 --heads 16 --kv-heads 4 --threads 2

This is a benchmark, not a test: its numbers go into notes, never into assertions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def build_checkpoint(folder: Path, hidden: int, heads: int, kv_heads: int, context: int) -> Path:
    from posenc.checkpoints.samples import NO_SPECIAL_TOKENS, Sample

    settings = {"hidden_size": hidden, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
                "num_key_value_heads": kv_heads, "vocab_size": 128, "max_position_embeddings": context,
                **NO_SPECIAL_TOKENS}  # fmt: skip
    sample = Sample("llama-bench", "Llama for the trace bench", "LlamaConfig", "LlamaForCausalLM", settings)
    if not (folder / "config.json").exists():
        sample.build(folder, shard="200MB")
    return folder


def export_both(folder: Path, out: Path) -> dict[str, Path]:
    """The family and traced exports of layer 0, each optimized for ort-cpu; name -> optimized graph."""
    from posenc.checkpoints import load_layer
    from posenc.export import export_onnx
    from posenc.export.trace import export_traced
    from posenc.graphs.optimize import optimize_file
    from posenc.graphs.trace_rewrite import replace_positions
    from posenc.validate import check_ort_parity

    loaded = load_layer(folder, 0)
    family = export_onnx(loaded.block(), out / "family.onnx", provenance=loaded.provenance())
    traced = export_traced(out / "trace.onnx", folder, layer=0, rewrite=replace_positions)
    paths = {}
    for name, result in (("family", family), ("trace", traced)):
        optimized = optimize_file(result.path, out / f"{name}_cpu.onnx", "ort-cpu", check=check_ort_parity)
        applied = ", ".join(f"{p.name} {p.count}" for p in optimized.passes if p.count)
        print(f"{name}: {optimized.path} ({applied})")
        paths[name] = optimized.path
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("bench-results/trace"))
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    args = parser.parse_args()

    from posenc.bench.timing import TimingSettings, measure_interleaved
    from posenc.export.feeds import make_feed
    from posenc.export.manifest import load_manifest
    from posenc.export.runtime import ort_session
    from posenc.export.shapes import SHAPE_PRESETS

    args.workdir.mkdir(parents=True, exist_ok=True)
    folder = build_checkpoint(args.workdir / "llama", args.hidden, args.heads, args.kv_heads, args.context)
    paths = export_both(folder, args.workdir)
    sessions = {name: ort_session(path, ["CPUExecutionProvider"], threads=args.threads, spinning=False)
                for name, path in paths.items()}  # fmt: skip
    manifest = load_manifest(paths["family"])
    settings = TimingSettings(warmup=5, repeats=args.repeats, max_seconds=args.max_seconds, rounds=args.rounds)
    print(f"Llama layer: hidden {args.hidden}, heads {args.heads}/{args.kv_heads}, ONNX Runtime CPU, "
          f"{args.threads} threads")  # fmt: skip
    print("| shape | family median ms | trace median ms | trace / family | max |diff| of out |")
    print("|---|---:|---:|---:|---:|")
    for name in ("prefill", "decode"):
        feed = make_feed(manifest, SHAPE_PRESETS[name], seed=0)
        outs = {n: s.run(None, feed) for n, s in sessions.items()}
        diff = float(np.abs(outs["trace"][0] - outs["family"][0]).max())
        calls = {n: (lambda s=s, feed=feed: s.run(None, feed)) for n, s in sessions.items()}
        timing = measure_interleaved(calls, settings)
        family, trace = timing["family"].median, timing["trace"].median
        print(f"| {name} {SHAPE_PRESETS[name].label} | {family * 1e3:.3f} | {trace * 1e3:.3f} | "
              f"{trace / family:.3f} | {diff:.1e} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
