"""``posenc optimize`` and ``posenc inspect``.

The parity check of ``posenc optimize`` comes from :mod:`posenc.cli` (``parity_check`` default of the
subcommand, :func:`posenc.validate.check_ort_parity`), since the graph layer does not import validate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.cli_args import add, check_output, path_arg

OPTIMIZE_EPILOG = """\
examples:
  posenc optimize rope.onnx --target ort-cpu -o rope.ort.onnx
  posenc optimize block.onnx --target trt -o block.trt.onnx          # then: posenc build block.trt.onnx
  posenc optimize block.onnx --target trt --rope plugin -o block.plugin.onnx

Writes OUT and its manifest (passes and match counts, parity before/after on ONNX Runtime CPU) together;
if the optimized graph does not reproduce the original within the scheme's tolerance nothing is written.
exit status: 0 written; 2 invalid options, unreadable model or parity failure."""

INSPECT_EPILOG = """\
examples:
  posenc inspect block.trt.onnx
  posenc inspect block.onnx --json --no-tensorrt

exit status: 0 inspected (also when TensorRT cannot parse the graph; see the report); 2 unreadable file."""


def _optimize(args: argparse.Namespace) -> int:
    from posenc.artifacts.files import check_apart
    from posenc.graphs.optimize import optimize_file

    output = Path(args.output) if args.output else _default_output(Path(args.model), args.target)
    check_output(str(output), "optimized model")
    check_apart([(output, "model")], [(args.model, "model")])
    check = None if args.no_parity else args.parity_check
    result = optimize_file(args.model, output, args.target, args.rope, check=check, fold_limit=args.fold_limit)
    manifest = result.manifest_path
    assert manifest is not None  # optimize_file writes the manifest beside the model, always
    if args.json:
        print(json.dumps({**result.to_dict(), "path": str(result.path), "manifest": str(manifest)}))
        return 0
    print(f"wrote {result.path} (+ {manifest.name})")
    for record in result.passes:
        note = f"  ({record.skipped})" if record.skipped else ""
        print(f"  {record.name:<22} {record.count}{note}")
        for reason in record.declined:
            print(f"  {'':<22}   left decomposed: {reason}")
    if result.parity:
        worst = max(result.parity.items(), key=lambda item: item[1].max_abs_diff)
        print(f"  parity on ONNX Runtime CPU: max |diff| {worst[1].max_abs_diff:.3g} ({worst[0]}) within tolerance")
    return 0


def _default_output(model: Path, target: str) -> Path:
    suffix = "trt" if target == "trt" else "ort"
    return model.with_name(f"{model.stem}.{suffix}.onnx")


def _inspect(args: argparse.Namespace) -> int:
    from posenc.graphs.inspect import inspect_model

    check = None if args.no_tensorrt else getattr(args, "tensorrt_check", None)  # posenc.cli sets it
    report = inspect_model(args.model, tensorrt_check=check, profile_text=getattr(args, "profile_text", None))
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from posenc.graphs.choices import DEFAULT_FOLD_LIMIT, ROPE_MODES, TARGETS

    p = subparsers.add_parser(
        "optimize",
        help="fold constants, fuse RoPE and attention for ONNX Runtime CPU or TensorRT",
        description="Rewrite an exported graph for a target: constant folding (size-bounded), decomposed RoPE "
        "-> RotaryEmbedding (3-D layout for ORT CPU, 4-D + activation-dtype caches for TensorRT), "
        "com.microsoft RotaryEmbedding -> standard op, attention -> Attention with the bias as mask.",
        epilog=OPTIMIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", type=path_arg, help="ONNX file (from `posenc export`)")
    p.add_argument("--target", required=True, choices=TARGETS, help="runtime the graph is for")
    p.add_argument(
        "--rope",
        default="fused",
        choices=ROPE_MODES,
        help="fused: standard RotaryEmbedding (default); plugin: posenc's TensorRT plugin node; keep: leave as is",
    )
    add(p, "output", note="the optimized .onnx file (default MODEL.ort.onnx / MODEL.trt.onnx), its manifest beside it")
    p.add_argument(
        "--fold-limit",
        type=int,
        default=DEFAULT_FOLD_LIMIT,
        help=f"largest constant (elements) folding may read or create (default {DEFAULT_FOLD_LIMIT})",
    )
    p.add_argument("--no-parity", action="store_true", help="skip the ONNX Runtime check before/after")
    add(p, "json", note="passes, match counts, parity and the paths written")
    # parity_check: the before/after check (posenc.graphs.optimize.ParityCheck). posenc.cli sets it to
    # posenc.validate's; this layer does not import posenc.validate.
    p.set_defaults(func=_optimize, parity_check=None)

    p = subparsers.add_parser(
        "inspect",
        help="op histogram, initializer bytes, fusions applied, whether TensorRT parses it",
        description="Describe an ONNX file: ops, initializer bytes, fused ops, the passes its manifest records, "
        "and whether TensorRT (tensorrt or tensorrt_rtx, when installed) can parse it.",
        epilog=INSPECT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", type=path_arg, help="ONNX file")
    p.add_argument("--no-tensorrt", action="store_true", help="skip the TensorRT parse")
    add(p, "json", note="the inspection report")
    p.set_defaults(func=_inspect)
