"""``posenc validate`` (parity of an exported model) and ``posenc sweep`` (error against position)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from posenc.errors import ConfigError

VALIDATE_EPILOG = """\
examples:
  posenc validate out/layer3.onnx --against-hf ckpt/   # vs the checkpoint's own transformers module too
  posenc validate out/rope.onnx
  posenc validate out/rope.onnx --shape 1,1,0 --shape 4,33,100 --report parity.md --json parity.json
  posenc validate out/yarn_fp16.onnx --batch 2 --seq 1 --past 511 --runs parity.runs.json
  posenc validate out/rope.trt.onnx --engine out/rope.engine      # GPU + tensorrt: TrtRunner joins the comparison

Reads the manifest beside the model (model.manifest.json) and the weights (model.weights.safetensors), rebuilds
the eager module in float64 (tables recomputed in float64), feeds both realistic inputs (position ids
past + arange(seq)) and compares every output with polygraphy (ONNX Runtime; CUDA provider when present;
with --engine also polygraphy's TrtRunner on each engine, which needs an NVIDIA GPU and datacenter tensorrt).
Default shapes: (B, S, P) = (1, 1, 0), (3, 7, 0), (2, 1, 9), (2, 13, 5), shrunk to fit a short table.
With --against-hf DIR (a model exported with `posenc export --hf-model DIR`), the references are the float64
eager rebuild, transformers' own attention module of that layer in fp32 (its own angles), and the same module
in float64 with float64 angles; a feed ending at the context length is added, where transformers' fp32 angles
drift, so its fp32 rows there are informational. Every row names its reference.
exit status: 0 every output within tolerance; 1 a mismatch (the table shows which);
2 an error: missing/corrupt model, manifest or weights, hash mismatch, positions past the table."""

SWEEP_EPILOG = """\
examples:
  posenc sweep -o report/sweep                      # RoPE family + relative schemes, fp32 and fp16, to 131072
  posenc sweep --scheme rope --scheme alibi --per-bucket 4 -o report/sweep
  posenc sweep --scheme rope_yarn --table-mode dynamic --dtype fp16 --max-position 65536 -o sweep_yarn

Writes OUT.json (series -> buckets and per-position points, for plots) and OUT.md (one row per
scheme/dtype/table mode/table dtype; cells: max abs error and ULPs per position bucket).
exit status: 0 all series pass; 1 a series exceeds its tolerance (or fp16 rounding); 2 an error."""


def _validate(args: argparse.Namespace) -> int:
    from posenc.errors import BackendUnavailable
    from posenc.export.runtime import ort_providers
    from posenc.export.units import FeedShape
    from posenc.validate.parity import validate_onnx

    shapes = [FeedShape.parse(text) for text in args.shape]
    if args.batch is not None or args.seq is not None or args.past is not None:
        batch, seq, past = (1 if args.batch is None else args.batch), (1 if args.seq is None else args.seq), args.past
        shapes.append(FeedShape(batch, seq, 0 if past is None else past))
    providers = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    if args.provider == "cuda" and "CUDAExecutionProvider" not in ort_providers():
        raise BackendUnavailable(
            "--provider cuda: this ONNX Runtime has no CUDA provider (needs onnxruntime-gpu and a GPU); "
            "use --provider cpu or auto."
        )
    runners: list[Any] = ["onnxrt"]
    if args.engine:
        from posenc.engine import engine_runner

        runners += [engine_runner(path) for path in args.engine]
    common = {
        "shapes": shapes or None,
        "runners": runners,
        "providers": providers.get(args.provider),
        "seed": args.seed,
        "quiet": not args.verbose,
    }
    if args.against_hf is not None:
        from posenc.validate.checkpoint import validate_against_checkpoint

        report = validate_against_checkpoint(
            args.model, args.against_hf, layer=args.layer, layer_type=args.layer_type, **common
        )
    elif args.layer is not None or args.layer_type is not None:
        raise ConfigError("--layer and --layer-type select the layer of --against-hf DIR; give --against-hf too.")
    else:
        report = validate_onnx(args.model, **common)
    print(report.to_markdown(), end="")
    report.save(markdown=args.report, json_path=args.json, run_results=args.runs)
    for path in (args.report, args.json, args.runs):
        if path:
            print(f"wrote {path}")
    if not report.passed:
        failures = report.failures()
        print(f"\nMISMATCH: {len(failures)} output(s) beyond tolerance (see the table above).")
        return 1
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from posenc.validate.sweep import position_sweep

    report = position_sweep(
        args.scheme or None,
        dtypes=args.dtype or ("fp32", "fp16"),
        table_modes=args.table_mode or None,
        fp16_tables=not args.no_fp16_tables,
        max_position=args.max_position,
        per_bucket=args.per_bucket,
        seed=args.seed,
    )
    prefix = Path(args.output)
    if args.output.endswith(("/", os.sep)) or prefix.is_dir():  # a folder: OUT/sweep.json and OUT/sweep.md
        prefix = prefix / "sweep"
    written = report.save(json_path=f"{prefix}.json", markdown=f"{prefix}.md")
    print(report.to_markdown(), end="")
    for path in written:
        print(f"wrote {path}")
    return 0 if report.passed else 1


def register(subparsers: Any) -> None:
    """Add the ``validate`` and ``sweep`` subcommands."""
    p = subparsers.add_parser(
        "validate",
        help="compare an exported ONNX model with its float64 eager PyTorch reference (polygraphy)",
        description="Parity of an exported model against eager PyTorch (float64, CPU) at several shapes.",
        epilog=VALIDATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="the .onnx file written by `posenc export`")
    p.add_argument("--shape", action="append", default=[], metavar="B,S[,P]", help="feed shape (repeat)")
    p.add_argument("--batch", type=int, help="batch of one extra shape")
    p.add_argument("--seq", type=int, help="new tokens of one extra shape")
    p.add_argument("--past", type=int, help="cached tokens of one extra shape")
    p.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto", help="ONNX Runtime provider")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", metavar="OUT.md", help="write the Markdown table")
    p.add_argument("--json", metavar="OUT.json", help="write the JSON report")
    p.add_argument("--runs", metavar="OUT.runs.json", help="write polygraphy's RunResults (all outputs)")
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="ENGINE",
        help="also run this TensorRT engine (posenc build output) with polygraphy's TrtRunner (repeat; GPU only)",
    )
    p.add_argument(
        "--against-hf",
        metavar="DIR",
        help="also compare with the checkpoint's own transformers attention module (a local checkpoint folder; "
        "needs transformers): fp32 with its own angles, and float64 angles near the context length",
    )
    p.add_argument("--layer", type=int, help="with --against-hf: the layer (default: the one in the manifest)")
    p.add_argument(
        "--layer-type", metavar="NAME", help="with --against-hf: the stack or layer type (default: manifest)"
    )
    p.add_argument("--verbose", action="store_true", help="show polygraphy's log")
    p.set_defaults(func=_validate)

    s = subparsers.add_parser(
        "sweep",
        help="error against position (to 131072) of exported positional ops, per position bucket",
        description="Export each scheme's op (fp32/fp16, both table modes) and measure its error against the "
        "float64 reference at positions sampled up to --max-position.",
        epilog=SWEEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--scheme", action="append", default=[], help="scheme to sweep (repeat; default: all relevant)")
    s.add_argument("--dtype", action="append", default=[], help="graph dtype fp32/fp16 (repeat; default both)")
    s.add_argument("--table-mode", action="append", default=[], choices=("precomputed", "dynamic"))
    s.add_argument("--no-fp16-tables", action="store_true", help="skip the fp16-table series")
    s.add_argument("--max-position", type=int, default=131072)
    s.add_argument("--per-bucket", type=int, default=8, help="sampled positions per bucket")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "-o", "--output", required=True, help="output prefix: writes OUT.json and OUT.md (OUT/sweep.* for a folder)"
    )
    s.set_defaults(func=_sweep)


__all__ = ["register"]
