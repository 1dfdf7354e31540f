#!/usr/bin/env python3
"""Benchmark the posenc RoPE kernel on an NVIDIA GPU (run by hand on a GPU machine; not a test).

Llama-3-8B prefill (B=1, S=4096, 32 q heads, 8 kv heads, D=128, bf16) and decode (B=64, S=1): the kernel (every
tactic) vs the measured device copy bandwidth, a torch eager rotate_half baseline and, with tensorrt installed,
TensorRT's native rotary layer and the plugin inside an engine. Targets: >= 90% of copy bandwidth (prefill),
<= 5 us per launch (decode), not slower than the native layer. Prints a table and writes JSON.

    python scripts/bench_rope_gpu.py --json rope_bench.json
    python scripts/bench_rope_gpu.py --smoke            # tiny shapes on CPU (Triton interpreter): harness check
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="rope_bench.json", help="where to write the results (JSON)")
    parser.add_argument("--iters", type=int, default=50, help="timed launches per contender")
    parser.add_argument("--no-tactics", action="store_true", help="time only the launcher's default block size")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

    from posenc.artifacts.files import write_json_atomic
    from posenc.bench.rope_kernel import SMOKE_CASES, format_table, run_benchmark
    from posenc.records import to_json

    if args.smoke:
        doc = run_benchmark(list(SMOKE_CASES), device="cpu", iters=2, tactics=False)
    else:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: run on a GPU machine, or use --smoke to check the harness", file=sys.stderr)
            return 2
        doc = run_benchmark(device="cuda", iters=args.iters, tactics=not args.no_tactics)
    print(format_table(doc))
    write_json_atomic(args.json, to_json(doc))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
