"""``posenc validate`` (parity of an exported model) and ``posenc sweep`` (error against position)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from posenc.cli_args import add, check_input, check_output, path_arg, print_result, split_names
from posenc.cli_parser import OldValueSpelling, add_alias
from posenc.errors import ConfigError

VALIDATE_EPILOG = """\
examples:
  posenc validate out/layer3.onnx --against-hf ckpt/   # vs the checkpoint's own transformers module too
  posenc validate out/rope.onnx
  posenc validate out/rope.onnx --shape 1,1,0 --shape 4,33,100 --report parity.md --json-out parity.json
  posenc validate out/yarn_fp16.onnx --shape 2,1,511 --runs parity.runs.json
  posenc validate out/yarn_fp16.onnx --shape 1,4,0@32764 --json     # far positions, the report as JSON
  posenc validate out/rope.trt.onnx --engine out/rope.engine      # GPU + tensorrt: TrtRunner joins the comparison
  posenc validate out/rope_inplace.onnx --decode   # prefill, 64 steps, a long jump: cache carried, every step held
  posenc validate out/layer3.onnx --decode --against-hf ckpt/   # every step also vs the module with its own cache

Reads the manifest beside the model (model.manifest.json) and the weights (model.weights.safetensors), rebuilds
the eager module in float64 (tables recomputed in float64), feeds both realistic inputs (position ids
past + arange(seq)) and compares every output with polygraphy (ONNX Runtime; CUDA provider when present;
with --engine also polygraphy's TrtRunner on each engine, which needs an NVIDIA GPU and datacenter tensorrt).
Shapes are B,S[,P][@START]: batch, new tokens, cached tokens, first position (default P).
Default shapes: (B, S, P) = (1, 1, 0), (3, 7, 0), (2, 1, 9), (2, 13, 5), shrunk to fit a short table, then a
window across each of the model's boundaries (LongRoPE's switch, llama3's band edges, YaRN's original context, a
sliding window's edge, the table's end).
With --against-hf DIR (a model exported with `posenc export --hf-model DIR`), the references are the float64
eager rebuild, transformers' own attention module of that layer in fp32 (its own angles), the same module in
float64 with float64 angles, and for fp16/bf16 graphs the module in that dtype (the graph may be at most twice as
far from the float64 rendering as it is); a feed ending at the context length is added. Where transformers' fp32
angles put its own output beyond the tolerance of the float64 rendering, its rows are informational (noted), on
any feed. Every row names its reference; every report states the rule and each row's margin (<= 1 passes).
exit status: 0 every output within tolerance; 1 a mismatch (the table shows which);
2 an error: missing/corrupt model, manifest or weights, hash mismatch, positions past the table."""

SWEEP_EPILOG = """\
examples:
  posenc sweep -o report/sweep                      # RoPE family + relative schemes, fp32 and fp16, to 131072
  posenc sweep -s rope -s alibi --per-bucket 4 -o report/sweep
  posenc sweep -s rope_yarn --table-mode dynamic --dtype fp16 --last-position 65536 -o sweep_yarn
  posenc sweep out/layer1.onnx -o out/layer1-sweep   # your export as it is, to the last position it serves

Writes OUT.json (series -> buckets and per-position points, for plots) and OUT.md (one row per
scheme/dtype/table mode/table dtype; cells: max abs error and ULPs per position bucket).
exit status: 0 all series pass; 1 a series exceeds its tolerance (or fp16 rounding); 2 an error."""


def _validate(args: argparse.Namespace) -> int:
    from posenc.artifacts.files import check_apart
    from posenc.errors import BackendUnavailable
    from posenc.export.runtime import ort_providers
    from posenc.export.shapes import Shape
    from posenc.validate.parity import validate_onnx

    for path, what in ((args.report, "--report file"), (args.json_out, "--json-out file"), (args.runs, "--runs file")):
        check_output(path, what)
    if Path(args.model).is_dir():
        return _validate_folder(args)
    reports = [(args.report, "file"), (args.json_out, "file"), (args.runs, "file")]
    check_apart(reports, [(args.model, "model"), *((engine, "engine") for engine in args.engine)])
    for engine in args.engine:
        check_input(engine, "engine", missing=f"build it with `posenc build MODEL.onnx -o {engine}`")
    shapes = [feed for _, feed in args.shape or []]
    if args.batch is not None or args.seq is not None or args.past is not None:  # the old spelling of one shape
        batch, seq, past = (1 if args.batch is None else args.batch), (1 if args.seq is None else args.seq), args.past
        shapes.append(Shape(batch, seq, 0 if past is None else past))
    providers = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    if args.provider == "cuda" and "CUDAExecutionProvider" not in ort_providers():
        raise BackendUnavailable(
            "--provider cuda: this ONNX Runtime has no CUDA provider (needs onnxruntime-gpu and a GPU); "
            "use --provider cpu or auto."
        )
    if args.decode:
        return _validate_decode(args, shapes, providers.get(args.provider))
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
    written = report.save(markdown=args.report, json_path=args.json_out, run_results=args.runs)
    notes = print_result(report.to_dict(), report.to_markdown(), as_json=args.json, written=written)
    if not report.passed:
        failures = report.failures()
        print(f"\nMISMATCH: {len(failures)} output(s) beyond tolerance (see the table above).", file=notes)
        return 1
    return 0


def _validate_folder(args: argparse.Namespace) -> int:
    """``posenc validate FOLDER``: every layer of a ``posenc export --layers`` folder, one table
    (:func:`posenc.validate.layers.validate_layers`)."""
    from posenc.export.shapes import Shape
    from posenc.validate.layers import validate_layers

    given = {"--decode": args.decode, "--engine": args.engine, "--runs": args.runs, "--layer": args.layer is not None,
             "--layer-type": args.layer_type is not None, "--provider cuda": args.provider == "cuda"}  # fmt: skip
    refused = [flag for flag, value in given.items() if value]
    if refused:
        raise ConfigError(
            f"{', '.join(refused)} apply to one model; validate a layer's file (FOLDER/layerN.onnx) for them, or "
            f"drop them to check every layer of {args.model}."
        )
    shapes = [feed for _, feed in args.shape or []]
    if args.batch is not None or args.seq is not None or args.past is not None:
        shapes.append(Shape(args.batch or 1, args.seq or 1, args.past or 0))
    report = validate_layers(args.model, args.against_hf, shapes=shapes or None, seed=args.seed, quiet=not args.verbose)
    written = report.save(markdown=args.report, json_path=args.json_out)
    notes = print_result(report.to_dict(), report.to_markdown(), as_json=args.json, written=written)
    if not report.passed:
        failed = ", ".join(str(layer.layer) for layer in report.failures())
        print(f"\nMISMATCH: layer(s) {failed} failed (see the table above).", file=notes)
        return 1
    return 0


def _validate_decode(args: argparse.Namespace, shapes: list[Any], providers: list[str] | None) -> int:
    """``posenc validate MODEL --decode``: the multi-step decode sequence (:func:`posenc.validate.decode`)."""
    from posenc.export.runtime import ort_providers
    from posenc.validate.decode import validate_decode

    for given, flag in ((args.engine, "--engine"), (args.runs, "--runs")):
        if given:
            raise ConfigError(
                f"{flag} does not apply to --decode (ONNX Runtime steps against their references); drop it."
            )
    options = {
        "jump": args.decode_jump,
        "seed": args.seed,
        "providers": providers or ort_providers(),
        "quiet": not args.verbose,
    }
    if args.against_hf is not None:
        from posenc.validate.checkpoint import decode_against_checkpoint

        report = decode_against_checkpoint(
            args.model,
            args.against_hf,
            layer=args.layer,
            layer_type=args.layer_type,
            schedule=shapes or None,
            **options,
        )
    else:
        report = validate_decode([args.model], shapes or None, **options)
    written = report.save(markdown=args.report, json_path=args.json_out)
    notes = print_result(report.to_dict(), report.to_markdown(), as_json=args.json, written=written)
    if not report.passed:
        print(
            f"\nMISMATCH: {len(report.failures())} step output(s) beyond tolerance (see the table above).", file=notes
        )
        return 1
    return 0


_SCHEME_SWEEP_OPTIONS = ("scheme", "dtype", "table_mode", "no_fp16_tables")


def _sweep(args: argparse.Namespace) -> int:
    from posenc.artifacts.files import check_apart
    from posenc.validate.sweep import position_sweep, sweep_artifact

    if args.model is not None:
        given = [f"--{name.replace('_', '-')}" for name in _SCHEME_SWEEP_OPTIONS if getattr(args, name)]
        if given:
            raise ConfigError(f"a model file fixes scheme, dtype and tables; drop {', '.join(given)}.")
        check_input(args.model, "ONNX model")
    if "bf16" in (args.dtype or ()):
        raise ConfigError("sweep runs on ONNX Runtime CPU, which has no bf16 kernels; use --dtype fp32 or fp16.")
    prefix = Path(args.output)
    if args.output.endswith(("/", os.sep)) or prefix.is_dir():  # a folder: OUT/sweep.json and OUT/sweep.md
        prefix = prefix / "sweep"
    else:  # a prefix must be new (a FIFO, device or file given as -o is a mistake, not a prefix)
        check_output(args.output, "sweep -o (a folder, or a new prefix for OUT.json and OUT.md)", folder=True)
    for suffix in (".json", ".md"):
        check_output(f"{prefix}{suffix}", "sweep report")
    check_apart([(f"{prefix}.json", "file"), (f"{prefix}.md", "file")], [(args.model, "model")])
    if args.model is not None:
        last = None if args.last_position is None else args.last_position
        report = sweep_artifact(args.model, max_position=last, per_bucket=args.per_bucket, seed=args.seed)
    else:
        report = position_sweep(
            split_names(args.scheme) or None,
            dtypes=args.dtype or ("fp32", "fp16"),
            table_modes=args.table_mode or None,
            fp16_tables=not args.no_fp16_tables,
            max_position=131072 if args.last_position is None else args.last_position,
            per_bucket=args.per_bucket,
            seed=args.seed,
        )
    written = report.save(json_path=f"{prefix}.json", markdown=f"{prefix}.md")
    print_result(report.to_dict(), report.to_markdown(), as_json=args.json, written=written)
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
    p.add_argument("model", type=path_arg, help="the .onnx file written by `posenc export`")
    add(p, "shape", repeat=True, note="default: four small shapes that fit the model's table")
    add_alias(p, "--batch", "batch", use="--shape B,S,P", type=int)
    add_alias(p, "--seq", "seq", use="--shape B,S,P", type=int)
    add_alias(p, "--past", "past", use="--shape B,S,P", type=int)
    p.set_defaults(batch=None, seq=None, past=None)
    p.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto", help="ONNX Runtime provider")
    add(p, "seed", default=0, note="for the random inputs; default 0")
    p.add_argument("--report", metavar="OUT.md", type=path_arg, help="write the Markdown table")
    add(p, "json", note="the parity report")
    add(p, "json_out", note="the parity report")
    p.keep_old_value_spelling(
        OldValueSpelling(
            "--json",
            matches=lambda value: value.endswith(".json") and not value.startswith("-"),
            rewrite=lambda value: ["--json-out", value],
            note="--json FILE is deprecated and goes in the next release: --json now prints the report as JSON; "
            "use --json-out FILE to write it.",
        )
    )
    p.add_argument("--runs", metavar="OUT.runs.json", type=path_arg, help="write polygraphy's RunResults (all outputs)")
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="ENGINE",
        type=path_arg,
        help="also run this TensorRT engine (posenc build output) with polygraphy's TrtRunner (repeat; GPU only)",
    )
    checkpoint = p.add_argument_group("the checkpoint's own attention module as a reference")
    add(
        checkpoint,
        "against_hf",
        note="fp32 with its own angles, and float64 angles near the context length (a model from "
        "`posenc export --hf-model DIR`)",
    )
    add(checkpoint, "layer", note="with --against-hf; default: the one in the manifest")
    add(checkpoint, "layer_type", note="with --against-hf; default: the one in the manifest")
    decode = p.add_argument_group("multi-step decode (a block's KV cache carried through the steps)")
    decode.add_argument(
        "--decode",
        action="store_true",
        help="run a decode sequence (a prefill, 64 single-token steps, a jump to the last position; or the --shape "
        "steps in order) through the graph, its cache carried (bound in place for --kv-cache inplace exports), "
        "every step against the float64 eager block",
    )
    decode.add_argument(
        "--decode-jump",
        choices=("position", "fill"),
        default="position",
        help="the default sequence's jump: one token at the last position, or a chunk filling the cache (default "
        "position)",
    )
    p.add_argument("--verbose", action="store_true", help="show polygraphy's log")
    p.set_defaults(func=_validate)

    s = subparsers.add_parser(
        "sweep",
        help="error against position (to 131072) of exported positional ops, per position bucket",
        description="Export each scheme's op (fp32/fp16, both table modes) and measure its error against the "
        "float64 reference at positions sampled up to --last-position.",
        epilog=SWEEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "model",
        nargs="?",
        type=path_arg,
        metavar="MODEL.onnx",
        help="an exported op or block (concat cache) to sweep as it is, up to the last position it serves; "
        "without it, each scheme's op is exported and swept",
    )
    add(s, "scheme", repeat=True, note="or comma-separated; default: the RoPE family and relative schemes")
    add(s, "dtype", repeat=True, note="default fp32 and fp16 (ONNX Runtime CPU has no bf16 kernels)")
    add(s, "table_mode", repeat=True, note="default: every mode each scheme has")
    s.add_argument("--no-fp16-tables", action="store_true", help="skip the fp16-table series")
    s.add_argument(
        "--last-position",
        type=int,
        default=None,
        metavar="N",
        help="largest position measured; precomputed tables get N + 1 rows (default 131072; for a MODEL.onnx the last "
        "position it serves)",
    )
    add_alias(s, "--max-position", "last_position", use="--last-position", type=int)
    s.add_argument("--per-bucket", type=int, default=8, help="sampled positions per bucket")
    add(s, "seed", default=0, note="for the sampled positions and inputs; default 0")
    add(s, "output", required=True, note="a prefix: writes OUT.json and OUT.md (OUT/sweep.* for a folder)")
    add(s, "json", note="the sweep report")
    s.set_defaults(func=_sweep)


__all__ = ["register"]
