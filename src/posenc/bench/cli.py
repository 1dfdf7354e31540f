"""``posenc bench``: latency of every scheme's op and block on every backend, against the copy roofline."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from posenc.bench.backends import BACKEND_NAMES
from posenc.bench.harness import JSON_NAME, MARKDOWN_NAME, RunSettings, run_bench
from posenc.bench.plan import LLAMA_LIKE, SUITES, TABLE_MODE_CHOICES, make_plan, targets_plan
from posenc.bench.shapes import PRESETS, parse_shape
from posenc.bench.tables import markdown_table, target_rows
from posenc.bench.timing import TimingSettings
from posenc.bench.workloads import UNITS
from posenc.config import AttentionConfig
from posenc.errors import ConfigError

EPILOG = """\
Examples:
  posenc bench --suite targets -o bench-targets        # the CPU targets, as ratios from one run
  posenc bench -s rope -s alibi --unit op --shape prefill --shape b=4,s=128 -o bench-results
  posenc bench -s rope --backend torch --backend ort-cpu --repeats 20 --threads 1

Shapes: `prefill` (b=1,s=512), `decode` (b=1,s=1,past=511) or NAME:b=B,s=S[,past=P].
Backends: torch, ort-cpu (exported graph), ort-cpu-fused (posenc.graphs output), ort-cuda, tensorrt;
those missing here are reported as skipped with the reason.
Writes OUT/bench.json (after every measurement), OUT/bench.md, OUT/latency.png, OUT/roofline.png.
"""


_GEOMETRY = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings")


def _split(values: list[str] | None) -> list[str]:
    """``-s a,b -s c`` -> ``[a, b, c]``."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def config_from_args(args: argparse.Namespace) -> AttentionConfig:
    """The Llama-like default geometry with the options given on the command line."""
    overrides = {field: getattr(args, field) for field in _GEOMETRY if getattr(args, field) is not None}
    if "num_heads" in overrides and "num_kv_heads" not in overrides:
        overrides["num_kv_heads"] = overrides["num_heads"]
    return dataclasses.replace(LLAMA_LIKE, **overrides)


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    timing = TimingSettings(
        warmup=args.warmup, repeats=args.repeats, min_repeats=min(5, args.repeats), max_seconds=args.max_seconds
    )
    return RunSettings(
        timing=timing,
        threads=args.threads,
        copy_mib=args.copy_mib,
        copy_repeats=args.copy_repeats,
        keep_models=args.keep_models,
        plots=not args.no_plots,
    )


def _run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    schemes = _split(args.scheme)
    backends = _split(args.backend)
    if args.suite == "targets":
        geometry = [f for f in _GEOMETRY if getattr(args, f) is not None]
        if args.unit or args.shape or args.table_mode != "auto" or geometry:
            raise ConfigError(
                "--suite targets fixes units, shapes, table modes and geometry; drop --unit/--shape/--table-mode "
                "and the geometry options (or leave out --suite to choose them)."
            )
        cases = targets_plan(schemes or None, backends or None)
    else:
        shapes = [parse_shape(s) for s in args.shape or []] or None
        cases = make_plan(
            schemes or None,
            _split(args.unit) or None,
            args.table_mode,
            shapes,
            backends or None,
            config_from_args(args),
        )
    out = Path(args.output)
    doc = run_bench(cases, settings, out, progress=not args.quiet)
    bw = doc.copy_bandwidth
    print(f"copy bandwidth {bw.bytes_per_s / 1e9:.1f} GB/s; {len(doc.ok())} of {len(doc.records)} measurements ran.")
    if doc.targets:
        print(markdown_table(*target_rows(doc)))
    print(f"results: {out / JSON_NAME}, {out / MARKDOWN_NAME}")
    missed = [t for t in doc.targets if t.passed is False]
    if args.fail_on_miss and missed:
        print(f"{len(missed)} target(s) missed.", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``posenc bench`` to the CLI."""
    p = subparsers.add_parser(
        "bench",
        help="latency of each scheme's op and block per backend, vs the copy-bandwidth roofline",
        description="Time each scheme's positional op and attention block on eager PyTorch, ONNX Runtime CPU "
        "(decomposed and fused graphs), ONNX Runtime CUDA and TensorRT (when present), at prefill and decode "
        "shapes: warm-up, repeats, median and p90, bytes/s and its ratio to the copy bandwidth measured in the "
        "same run. Results are saved after every measurement; Ctrl-C keeps them.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--suite", choices=SUITES, default="default", help="what to measure (default: the options below)")
    p.add_argument(
        "-s",
        "--scheme",
        action="append",
        metavar="NAME",
        help="scheme(s); repeat or comma-separate (default: every registered scheme)",
    )
    p.add_argument(
        "--unit", action="append", metavar="UNIT", help=f"{' or '.join(UNITS)} (default: every unit the scheme exports)"
    )
    p.add_argument(
        "--table-mode",
        choices=TABLE_MODE_CHOICES,
        default="auto",
        help="auto = precomputed where the scheme has it, else dynamic (default)",
    )
    p.add_argument(
        "--shape",
        action="append",
        metavar="SPEC",
        help=f"presets {sorted(PRESETS)} or NAME:b=B,s=S[,past=P]; repeatable (default: prefill, decode)",
    )
    p.add_argument("--backend", action="append", metavar="NAME", help=f"{', '.join(BACKEND_NAMES)} (default: all)")
    geometry = p.add_argument_group("geometry (default: Llama-like, hidden 1024, 8/2 heads, head_dim 128)")
    geometry.add_argument("--hidden-size", dest="hidden_size", type=int)
    geometry.add_argument("--heads", dest="num_heads", type=int)
    geometry.add_argument("--kv-heads", dest="num_kv_heads", type=int)
    geometry.add_argument("--head-dim", dest="head_dim", type=int)
    geometry.add_argument("--max-positions", dest="max_position_embeddings", type=int)
    timing = p.add_argument_group("timing")
    timing.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads (default: all CPUs)")
    timing.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    timing.add_argument("--repeats", type=int, default=50, help="timed calls (default 50)")
    timing.add_argument("--max-seconds", type=float, default=10.0, help="time budget per measurement (default 10)")
    timing.add_argument("--copy-mib", type=int, default=1024, help="copy-bandwidth array size, MiB (default 1024)")
    timing.add_argument("--copy-repeats", type=int, default=5, help="timed copies (default 5)")
    p.add_argument("-o", "--output", default="bench-results", help="output folder (default bench-results)")
    p.add_argument("--keep-models", action="store_true", help="keep the ONNX graphs under OUT/models")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 when a target is missed")
    p.set_defaults(func=_run)
