#!/usr/bin/env python
"""Decomposed vs fused RoPE on ONNX Runtime CPU (median latency), via posenc's export and graph passes.

Two graphs per scheme, fp32, ``intra_op_num_threads`` threads:

- ``op``: posenc's rotation op (q ``[B, H, S, D]``, k ``[B, H, S, D]``, position ids ``[B, S]``) as exported
  (Slice/Mul/Sub/Add/Concat) and after ``posenc optimize --target ort-cpu`` (two 4-D RotaryEmbedding nodes);
- ``proj``: q and k arriving as ``[B, S, H*D]`` projections that are split into heads and transposed before
  the rotation (as in an attention block); ``--target ort-cpu`` rotates the 3-D tensors before the transpose.

Usage::

    .venv/bin/python scripts/bench_fusion_cpu.py                      # B=1 S=2048 H=32 D=128, 2 threads
    .venv/bin/python scripts/bench_fusion_cpu.py --seq 512 --repeats 50 -o bench-fusion.json

No logic lives here that the package lacks: export, optimize and the feeds are posenc's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from posenc import AttentionConfig, build_scheme, get_spec
from posenc.export import export_module, export_onnx
from posenc.graphs import optimize_file
from posenc.schemes.base import Placement
from posenc.validate import check_ort_parity


class ProjectedRotation(nn.Module):
    """q, k ``[B, S, H*D]`` -> heads ``[B, H, S, D]`` -> the scheme's rotation (the block's layout)."""

    def __init__(self, scheme: nn.Module, heads: int, head_dim: int) -> None:
        super().__init__()
        self.scheme, self.heads, self.head_dim = scheme, heads, head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, _ = q.shape
        q4 = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k4 = k.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        return self.scheme.rotate(q4, k4, position_ids)


def median_ms(path: Path, feed: dict[str, np.ndarray], threads: int, warmup: int, repeats: int) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(args: argparse.Namespace) -> dict:
    b, s, h, d = args.batch, args.seq, args.heads, args.head_dim
    config = AttentionConfig(hidden_size=h * d, num_heads=h, num_kv_heads=h, max_position_embeddings=max(s, 64))
    rng = np.random.default_rng(0)
    positions = np.broadcast_to(np.arange(s, dtype=np.int64), (b, s)).copy()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for layout in args.layouts:
            params = {"layout": layout}
            op = export_onnx(folder / f"op_{layout}.onnx", args.scheme, unit="op", config=config, params=params)
            scheme = build_scheme(args.scheme, config, params).eval()
            sample = (torch.randn(2, 4, h * d), torch.randn(2, 4, h * d), torch.arange(4).expand(2, 4))
            proj = export_module(
                ProjectedRotation(scheme, h, d),
                sample,
                folder / f"proj_{layout}.onnx",
                input_names=["q", "k", "position_ids"],
                output_names=["q_rot", "k_rot"],
                dynamic_dims=[{0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}],
            )
            for unit, source, shape in (("op", op.path, (b, h, s, d)), ("proj", proj, (b, s, h * d))):
                fused = optimize_file(source, folder / f"{unit}_{layout}.ort.onnx", "ort-cpu", check=check_ort_parity)
                feed = {
                    "q": rng.standard_normal(shape, dtype=np.float32),
                    "k": rng.standard_normal(shape, dtype=np.float32),
                    "position_ids": positions,
                }
                decomposed_ms = median_ms(Path(source), feed, args.threads, args.warmup, args.repeats)
                fused_ms = median_ms(fused.path, feed, args.threads, args.warmup, args.repeats)
                rows.append(
                    {
                        "unit": unit,
                        "layout": layout,
                        "decomposed_ms": round(decomposed_ms, 3),
                        "fused_ms": round(fused_ms, 3),
                        "speedup": round(decomposed_ms / fused_ms, 2),
                        "passes": {k: v for k, v in fused.counts.items() if v},
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return {
        "scheme": args.scheme,
        "shape": {"batch": b, "seq": s, "heads": h, "head_dim": d},
        "dtype": "float32",
        "threads": args.threads,
        "repeats": args.repeats,
        "onnxruntime": __import__("onnxruntime").__version__,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheme", default="rope", help="a rotary scheme (posenc list: family rope)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--layouts", nargs="+", default=["half", "interleaved"], choices=["half", "interleaved"])
    parser.add_argument("-o", "--output", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if get_spec(args.scheme).placement is not Placement.QK:
        parser.error(f"--scheme {args.scheme}: this benchmark fuses rotations of q and k; pick a RoPE scheme.")
    torch.set_num_threads(args.threads)
    result = run(args)
    print("\n| unit | layout | decomposed (ms) | fused (ms) | speedup |\n|---|---|---|---|---|")
    for row in result["rows"]:
        print(f"| {row['unit']} | {row['layout']} | {row['decomposed_ms']} | {row['fused_ms']} | {row['speedup']}x |")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
