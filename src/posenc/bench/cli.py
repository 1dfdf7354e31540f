"""``posenc bench``: latency of every scheme's op and block on every backend, against the copy roofline."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from posenc.bench.backends import BACKEND_NAMES
from posenc.bench.harness import JSON_NAME, MARKDOWN_NAME, RunSettings, run_bench
from posenc.bench.plan import LLAMA_LIKE, SUITES, make_plan, targets_plan
from posenc.bench.shapes import Shape
from posenc.bench.tables import artifact_rows, markdown_table, target_rows
from posenc.bench.timing import TimingSettings
from posenc.cli_args import (
    TABLE_MODES,
    add,
    add_geometry,
    check_input,
    check_output,
    config_from_args,
    geometry_given,
    print_result,
    split_names,
)
from posenc.cli_parser import OldValueSpelling, add_alias
from posenc.errors import ConfigError

EPILOG = """\
Examples:
  posenc bench out/layer1.onnx -o bench-layer1          # your artifact as shipped: prefill vs GEMM, decode vs copy
  posenc bench --hf-model ckpt/ --layer 3 -o bench-ckpt  # a checkpoint's layer, exported with its weights, timed
  posenc bench --suite targets -o bench-targets        # the CPU targets, as ratios from one run
  posenc bench -s rope -s alibi --unit op --shape prefill --shape 4,128 -o bench-results
  posenc bench -s rope --unit block --kv-cache concat --kv-cache inplace --shape 1,1,4095 -o bench-decode
  posenc bench -s rope --backend torch --backend ort-cpu --repeats 20 --threads 1
  posenc bench -s rope --unit op-3d --shape long:1,2048 --hidden-size 4096 --num-heads 32 -o bench-rope

Shapes: B,S[,P][@START] (batch, new tokens, cached tokens, first position), NAME: before it to label it
(long:1,2048), or the presets prefill (1,512) and decode (1,1,511).
Geometry: head_dim is --hidden-size // --num-heads unless --head-dim is given; precomputed tables get
max(--max-position-embeddings, last position + 1) rows.
Backends: torch, ort-cpu (exported graph), ort-cpu-fused (posenc.graphs output for ort-cpu), ort-cpu-gqa (the
ort-cuda graph on the CPU: contrib GroupQueryAttention), ort-cuda, ort-cuda-fused, tensorrt; those missing here
are reported as skipped with the reason. A block with both --kv-cache layouts times them in the same rounds.
Writes OUT/bench.json (after every measurement), OUT/bench.md, OUT/latency.png, OUT/roofline.png.
"""


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
        position_guard=args.position_guard,
        guard_cost=args.guard_cost,
    )


def _table_mode_choice(modes: list[str] | None) -> str:
    """Repeated ``--table-mode`` -> a plan choice: none -> ``auto``, one -> it, both -> ``all``."""
    chosen = set(modes or ())
    if not chosen:
        return "auto"
    return "all" if chosen == set(TABLE_MODES) else chosen.pop()


_SCHEME_CHOICES = ("scheme", "unit", "kv_cache", "table_mode", "guard_cost")


def _artifact_cases(args: argparse.Namespace, backends: list[str]) -> list[Any]:
    """The cases of ``posenc bench MODEL.onnx ...`` / ``--hf-model DIR``: the artifacts timed as they are."""
    from posenc.bench.artifact import artifact_plan

    chosen = [name for name in _SCHEME_CHOICES if getattr(args, name)]
    if chosen or args.suite != "default" or geometry_given(args):
        flags = [f"--{name.replace('_', '-')}" for name in chosen] or ["--suite/geometry options"]
        raise ConfigError(
            f"a model file (or --hf-model) fixes scheme, unit, cache layout, table mode and geometry; drop "
            f"{', '.join(flags)} (--shape, --backend and the timing options apply)."
        )
    for model in args.model:
        check_input(model, "ONNX model")
    models = list(args.model)
    if args.hf_model is not None:
        models.append(str(_export_checkpoint_layer(args)))
    shapes = [Shape.named(name, feed) for name, feed in args.shape or []]
    return artifact_plan(models, shapes or None, backends)


def _export_checkpoint_layer(args: argparse.Namespace) -> Path:
    """Export ``--layer`` of ``--hf-model`` (its own weights, precomputed tables, concatenated cache) into the results
    folder, as ``posenc export --hf-model`` would, and return the file."""
    from posenc.checkpoints import load_layer
    from posenc.export import export_onnx

    loaded = load_layer(args.hf_model, args.layer, args.layer_type)
    name = Path(args.hf_model).resolve().name or "checkpoint"
    path = Path(args.output) / "models" / f"{name}-layer{loaded.plan.layer}.onnx"
    return export_onnx(loaded.block(), path, provenance=loaded.provenance(), copy=False).path


def _run(args: argparse.Namespace) -> int:
    check_output(args.output, "results folder", folder=True)
    settings = settings_from_args(args)
    schemes = split_names(args.scheme)
    backends = split_names(args.backend)
    if args.model or args.hf_model is not None:
        cases = _artifact_cases(args, backends)
    elif args.layer is not None or args.layer_type is not None:
        raise ConfigError("--layer and --layer-type choose a layer of --hf-model; add --hf-model DIR.")
    elif args.suite == "targets":
        if args.unit or args.shape or args.table_mode or args.kv_cache or geometry_given(args):
            raise ConfigError(
                "--suite targets fixes units, cache layouts, shapes, table modes and geometry; drop --unit/--kv-cache/"
                "--shape/--table-mode and the geometry options (or leave out --suite to choose them)."
            )
        cases = targets_plan(schemes or None, backends or None)
    else:
        shapes = [Shape.named(name, feed) for name, feed in args.shape or []]
        cases = make_plan(
            schemes or None,
            args.unit or None,
            _table_mode_choice(args.table_mode),
            shapes or None,
            backends or None,
            config_from_args(args, LLAMA_LIKE),
            args.kv_cache or ("concat",),
        )
    out = Path(args.output)
    doc = run_bench(cases, settings, out, progress=not args.quiet)
    bw = "n/a" if doc.copy_bandwidth is None else f"{doc.copy_bandwidth.bytes_per_s / 1e9:.1f} GB/s"
    lines = [f"copy bandwidth {bw}; {len(doc.ok())} of {len(doc.records)} measurements ran."]
    artifacts = artifact_rows(doc)
    if artifacts[1]:
        lines.append(markdown_table(*artifacts))
    if doc.targets:
        lines.append(markdown_table(*target_rows(doc)))
    lines.append(f"results: {out / JSON_NAME}, {out / MARKDOWN_NAME}")
    print_result(doc.to_dict(), "\n".join(lines), as_json=args.json)
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
    p.add_argument(
        "model",
        nargs="*",
        metavar="MODEL.onnx",
        help="exported or optimized ONNX files (with their manifests) to time as they are: their dtype, tables, "
        "cache layout and weights; prefill against a GEMM and decode against a copy, from one run",
    )
    checkpoint = p.add_argument_group("a checkpoint's layer, exported then timed as a MODEL.onnx")
    add(checkpoint, "hf_model")
    add(checkpoint, "layer", note="default: 0, or the first layer of --layer-type where layers differ")
    add(checkpoint, "layer_type")
    p.add_argument("--suite", choices=SUITES, default="default", help="what to measure (default: the options below)")
    add(p, "scheme", repeat=True, note="or comma-separated; default: every registered scheme")
    add(p, "unit", repeat=True, note="default: every unit the scheme exports")
    add(p, "kv_cache", repeat=True, note="the block's cache layouts to time (both: in the same rounds); default concat")
    add(p, "table_mode", repeat=True, note="give both for both; default: precomputed where the scheme has it")
    p.keep_old_value_spelling(
        OldValueSpelling(
            "--table-mode",
            matches=lambda value: value in ("auto", "all"),
            rewrite=lambda value: [] if value == "auto" else ["--table-mode", "precomputed", "--table-mode", "dynamic"],
            note="--table-mode auto/all is deprecated and goes in the next release; leave --table-mode out for auto, "
            "give --table-mode precomputed --table-mode dynamic for all.",
        )
    )
    add(p, "shape", repeat=True, note="default: prefill and decode")
    p.add_argument("--backend", action="append", metavar="NAME", help=f"{', '.join(BACKEND_NAMES)} (default: all)")
    add_geometry(p, "attention geometry (default: Llama-like, hidden 1024, 8/2 heads, head_dim 128, context 4096)")
    add_alias(p, "--heads", "num_heads", use="--num-heads", type=int)
    add_alias(p, "--kv-heads", "num_kv_heads", use="--num-kv-heads", type=int)
    add_alias(
        p,
        "--max-positions",
        "max_position_embeddings",
        use="--max-position-embeddings (the context length; --max-positions means table rows elsewhere)",
        type=int,
    )
    timing = p.add_argument_group("timing")
    add(timing, "threads", default=os.cpu_count() or 1, note="default: all CPUs")
    timing.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    timing.add_argument("--repeats", type=int, default=50, help="timed calls (default 50)")
    timing.add_argument("--max-seconds", type=float, default=10.0, help="time budget per measurement (default 10)")
    timing.add_argument("--copy-mib", type=int, default=1024, help="copy-bandwidth array size, MiB (default 1024)")
    timing.add_argument("--copy-repeats", type=int, default=5, help="timed copies (default 5)")
    add(p, "output", default="bench-results", note="a folder: bench.json, bench.md and plots (default bench-results)")
    add(p, "keep_models")
    add(p, "position_guard", default=True, note="default on; --no-position-guard times graphs without it")
    p.add_argument(
        "--guard-cost",
        action="store_true",
        help="also time every graph exported without the position guard, in the same rounds: the guard's cost "
        "(target <= 2 %%)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    add(p, "quiet")
    add(p, "json", note="the benchmark document")
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 when a target is missed")
    p.set_defaults(func=_run)
