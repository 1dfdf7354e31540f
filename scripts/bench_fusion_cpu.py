#!/usr/bin/env python
"""Decomposed vs fused RoPE on ONNX Runtime CPU (median latency), via posenc's export and graph passes.

Two graphs per scheme, fp32, ``intra_op_num_threads`` threads:

- ``op``: posenc's rotation op (q ``[B, H, S, D]``, k ``[B, H, S, D]``, position ids ``[B, S]``) as exported
  (Slice/Mul/Sub/Add/Concat) and after ``posenc optimize --target ort-cpu`` (two 4-D RotaryEmbedding nodes);
- ``op-3d``: posenc's rotation on q and k in the projection layout ``[B, S, H*D]``
  (:class:`posenc.export.units.RotateProjectionOp`: heads split and transposed before the rotation, as in an
  attention block); ``--target ort-cpu`` rotates the 3-D tensors before the transpose.

Usage::

    .venv/bin/python scripts/bench_fusion_cpu.py                      # B=1 S=2048 H=32 D=128, 2 threads
    .venv/bin/python scripts/bench_fusion_cpu.py --seq 512 --repeats 50 -o bench-fusion.json

No logic lives here that the package lacks: export, optimize, ONNX Runtime sessions and timing are posenc's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from posenc import AttentionConfig, get_spec
from posenc.bench.timing import TimingSettings, measure
from posenc.export import export_scheme, ort_session
from posenc.graphs import optimize_file
from posenc.schemes.base import Placement
from posenc.validate import check_ort_parity


def median_ms(path: Path, feed: dict[str, np.ndarray], threads: int, warmup: int, repeats: int) -> float:
    session = ort_session(path, ["CPUExecutionProvider"], threads=threads)
    settings = TimingSettings(warmup=warmup, repeats=repeats, min_repeats=repeats, max_seconds=None)
    return measure(lambda: session.run(None, feed), settings).median * 1e3


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
            op = export_scheme(args.scheme, folder / f"op_{layout}.onnx", unit="op", config=config, params=params)
            op_3d = export_scheme(
                args.scheme, folder / f"op3d_{layout}.onnx", unit="op-3d", config=config, params=params
            )
            for unit, source, shape in (("op", op.path, (b, h, s, d)), ("op-3d", op_3d.path, (b, s, h * d))):
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
