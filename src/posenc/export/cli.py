"""``posenc export``: a scheme's positional op or a whole attention block to ONNX (+ manifest, weights)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc.cli_args import add, add_geometry, check_input, check_output, config_from_args
from posenc.errors import ConfigError
from posenc.export.kinds import BLOCK_INPLACE, UnitKind
from posenc.provenance import describe_weights

if TYPE_CHECKING:
    from posenc.export.exporter import Exportable
    from posenc.provenance import WeightsSource

EPILOG = """\
examples:
  posenc export --hf-model ckpt/ --layer 3 -o out/layer3.onnx       # a checkpoint's layer with its weights
  posenc export --hf-model ckpt/ --layers all -o out/layers/        # every layer; one tables file they share
  posenc export --hf-model ckpt/ --layers 0-3,7 -o out/some/         # a range and a list
  posenc export --hf-model ckpt/ --layer 5 --layer-type decoder --table-mode dynamic --dtype fp16 -o out/dec5.onnx
  posenc export --hf-model phi-ckpt/ --via trace -o out/phi0.onnx   # any model type: its own module, posenc's tables
  posenc export --scheme rope -o out/rope.onnx
  posenc export --scheme rope --kv-cache inplace -o out/rope_inplace.onnx   # preallocated cache, opset 24
  posenc export --scheme rope_yarn --param factor=8 --param original_max_position_embeddings=4096 \\
      --table-mode dynamic --dtype fp16 -o out/yarn_fp16.onnx
  posenc export --scheme alibi --unit op --num-heads 12 --hidden-size 768 -o out/alibi_bias.onnx   # head_dim 64
  posenc export --scheme rope --hidden-size 1024 --num-heads 8 --num-kv-heads 2 --head-dim 128 \\
      --max-position-embeddings 4096 --max-positions 8192 -o out/rope_gqa.onnx
  posenc export --hf-config config.json --dtype bf16 --max-positions 8192 -o out/model_attn.onnx
  posenc export --scheme rope_dynamic --table-mode dynamic --opset 18 -o out/ntk_opset18.onnx

--max-position-embeddings is the model's context length; --max-positions the rows of precomputed tables
(default: the context length). head_dim is --hidden-size // --num-heads unless --head-dim is given.

Writes OUT, OUT's manifest (model.onnx -> model.manifest.json) and weights (model.weights.safetensors)
together; a failed export leaves none of them. The manifest records where the weights came from: the
checkpoint's layer (tensor names and sha256) with --hf-model, else random weights with their --seed.
Then: `posenc validate OUT` (and `--against-hf CKPT` for a checkpoint's layer).
exit status: 0 written; 2 invalid options or export failure (the message says what to change)."""


def _parse_params(items: list[str]) -> dict[str, str]:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param takes KEY=VALUE (e.g. --param factor=8), got {item!r}.")
        params[key.strip()] = value.strip()
    return params


def _geometry(args: argparse.Namespace) -> tuple[Any, str | None, dict[str, Any]]:
    from posenc.config import AttentionConfig, from_hf_config

    scheme, params, base = args.scheme, {}, AttentionConfig()
    if args.hf_config:
        imported = from_hf_config(args.hf_config, args.layer_type)
        base = imported.config
        if scheme is None or scheme == imported.scheme:
            scheme, params = imported.scheme, dict(imported.params)
    config = config_from_args(args, base)
    if "bidirectional" in params and scheme == "t5":
        params["bidirectional"] = not config.causal  # imported from the config's causality; --causal may change it
    params.update(_parse_params(args.param))
    return config, scheme, params


_CHECKPOINT_FIXED = ("scheme", "hf_config", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "causal")


def _refuse_geometry(args: argparse.Namespace) -> None:
    """Refuse geometry, scheme and parameter options beside ``--hf-model`` (the checkpoint fixes them)."""
    given = [name for name in _CHECKPOINT_FIXED if getattr(args, name) not in (None, False)]
    if given or args.param or args.max_position_embeddings is not None:
        flags = [f"--{name.replace('_', '-')}" for name in given] + (["--param"] if args.param else [])
        flags = flags or ["--max-position-embeddings"]
        raise ConfigError(
            f"--hf-model takes geometry, scheme and parameters from the checkpoint; drop {', '.join(flags)}."
        )


def _via(args: argparse.Namespace) -> str:
    """``family`` or ``trace``: as given, else the family where the checkpoint's model type (or its text tower's)
    has one."""
    if args.via is not None:
        return str(args.via)
    from posenc.checkpoints.load import loads_by_family

    return "family" if loads_by_family(args.hf_model) else "trace"


def _export_traced(args: argparse.Namespace) -> Any:
    """Export layer ``--layer`` of the checkpoint as its model calls it, with posenc's tables (the traced path)."""
    from posenc.export.trace import export_traced
    from posenc.graphs.trace_rewrite import replace_positions

    if args.unit != "block":
        raise ConfigError(f"--via trace exports the attention block; drop --unit {args.unit}.")
    return export_traced(
        args.output, args.hf_model, layer=args.layer, rewrite=replace_positions, **_checkpoint_options(args)
    )


def _checkpoint_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of a checkpoint's export that ``--via trace`` and ``--layers`` both take from the command line."""
    return {
        "layer_type": args.layer_type,
        "table_mode": args.table_mode,
        "max_positions": args.max_positions,
        "dtype": args.dtype,
        "kv_cache": args.kv_cache,
        "opset": args.opset,
        "position_guard": args.position_guard,
    }


def _module(args: argparse.Namespace, kind: UnitKind) -> tuple[Exportable, WeightsSource]:
    """``(module, provenance)``: what the export writes, built once: layer ``--layer`` of ``--hf-model`` with its
    weights, or the scheme's unit with random weights of ``--seed``."""
    from posenc.export.exporter import build_module
    from posenc.provenance import RandomWeights

    if args.hf_model is not None:
        from posenc.checkpoints import load_layer

        loaded = load_layer(args.hf_model, args.layer, args.layer_type)
        return loaded.block(args.table_mode, args.max_positions), loaded.provenance()
    config, scheme, params = _geometry(args)
    if scheme is None:
        raise ConfigError("give --hf-model DIR, --scheme NAME (see `posenc list`) or --hf-config config.json.")
    built = build_module(
        scheme,
        kind,
        config=config,
        params=params,
        table_mode=args.table_mode,
        max_positions=args.max_positions,
        seed=args.seed,
    )
    return built, RandomWeights(args.seed)


def _export_layers(args: argparse.Namespace) -> int:
    """``--layers``: every selected layer of ``--hf-model`` into the folder ``-o`` (:mod:`posenc.export.layers`)."""
    from posenc.artifacts.files import json_text
    from posenc.export.layers import export_layers

    if args.hf_model is None:
        raise ConfigError("--layers selects layers of --hf-model; give --hf-model DIR too.")
    if args.layer is not None:
        raise ConfigError("give --layer N (one layer, -o FILE.onnx) or --layers SPEC (several, -o FOLDER), not both.")
    if args.via == "trace" or _via(args) == "trace":
        raise ConfigError(
            "--layers exports through a model family; this checkpoint's layers go by --via trace one at a time: "
            "posenc export --hf-model DIR --via trace --layer N -o OUT/layerN.onnx."
        )
    if args.unit != "block":
        raise ConfigError(f"--layers exports attention blocks; drop --unit {args.unit}.")
    _refuse_geometry(args)
    result = export_layers(
        args.output,
        args.hf_model,
        args.layers,
        optimize=not args.no_optimize,
        cache_capacity=args.cache_capacity,
        **_checkpoint_options(args),
    )
    index = result.index
    if args.json:
        print(json_text(index.to_dict()), end="")
        return 0
    total = sum(p.stat().st_size for p in result.folder.iterdir() if p.is_file())
    print(f"wrote {len(index.layers)} layers of {index.checkpoint} into {result.folder} ({total / 2**20:.1f} MiB)")
    for layer, manifest in zip(index.layers, result.manifests, strict=True):
        kind = f" ({layer.layer_type})" if layer.layer_type else ""
        print(f"  {layer.onnx}{kind}: {manifest.scheme}, weights {manifest.weights.path}")
    print(f"  tables: {index.tables.path}, shared by every layer (each distinct table once)")
    for skipped in index.skipped:
        print(f"  skipped layer {skipped.layer}: {skipped.reason}")
    print(f"next: posenc validate {result.folder} --against-hf {args.hf_model}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from posenc.artifacts.files import check_apart
    from posenc.export import export_onnx

    if args.layers is not None:
        check_output(args.output, "--layers output folder", folder=True)
        return _export_layers(args)
    check_output(args.output, "ONNX model")
    check_input(args.hf_config, "--hf-config file")
    check_apart([(args.output, "model")], [(args.hf_config, "file")])
    if args.hf_model is not None:
        _refuse_geometry(args)
    elif args.layer is not None or args.via is not None:
        flag = "--layer selects a layer" if args.via is None else "--via chooses how to export a layer"
        raise ConfigError(f"{flag} of --hf-model; give --hf-model DIR too.")
    if args.hf_model is not None and _via(args) == "trace":
        result = _export_traced(args)
    else:
        kind = UnitKind.parse(args.unit, args.kv_cache)
        module, provenance = _module(args, kind)
        result = export_onnx(
            module,
            args.output,
            unit=kind,
            dtype=args.dtype,
            opset=args.opset,
            optimize=not args.no_optimize,
            position_guard=args.position_guard,
            cache_capacity=args.cache_capacity,
            provenance=provenance,
            copy=False,  # built for this export alone
        )
    m = result.manifest
    if args.json:
        print(m.to_json(), end="")
        return 0
    size = Path(result.path).stat().st_size
    limit = f"max_positions {m.max_positions}" if m.max_positions is not None else "no position limit"
    print(f"wrote {result.path} ({size / 1024:.1f} KiB, sha256 {m.onnx_sha256[:16]})")
    print(f"  manifest {result.manifest_path}; weights {result.weights_path}")
    print(f"  weights: {describe_weights(m.weights.source)}")
    print(f"  {m.scheme} | unit {m.unit} | {m.dtype} (tables {m.table_dtype}) | {m.table_mode}, {limit}", end="")
    print(f" | opset {m.opset}")
    for label, specs in (("inputs ", m.inputs), ("outputs", m.outputs)):
        text = ", ".join(f"{s.name} {s.dtype}[{', '.join(str(d) for d in s.shape)}]" for s in specs)
        print(f"  {label}: {text}")
    for note in m.notes:
        print(f"  note: {note}")
    decode = " --decode" if m.unit == BLOCK_INPLACE else ""  # an in-place graph is proven over a decode sequence
    print(f"next: posenc validate {result.path}{decode}")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``export`` subcommand."""
    from posenc.export.torch_onnx import DEFAULT_OPSET, INPLACE_OPSET, SUPPORTED_OPSETS

    p = subparsers.add_parser(
        "export",
        help="export a scheme's op or an attention block to ONNX (with manifest and weights)",
        description="Export a positional scheme's op, or a whole AttentionBlock, to ONNX with torch.onnx.export"
        "(dynamo=True): dynamic batch/seq/past, tables precomputed or computed in the graph.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add(p, "scheme", note="or --hf-model / --hf-config")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="scheme parameter (repeat)")
    add(p, "unit", default="block", note="default block")
    add(p, "kv_cache", default="concat", note="default concat")
    p.add_argument(
        "--cache-capacity",
        type=int,
        metavar="N",
        help="slots of the in-place cache (with --kv-cache inplace), independent of the table's length; default: "
        "the table's length (131072 slots of fp32 keys for Llama 3.2 is 268 MB per sequence per layer)",
    )
    add(p, "table_mode", note="default: precomputed where the scheme has it")
    add(p, "dtype", default="fp32", note="default fp32")
    p.add_argument(
        "--opset",
        type=int,
        default=None,
        help=f"one of {list(SUPPORTED_OPSETS)} (default {DEFAULT_OPSET}; {INPLACE_OPSET} with --kv-cache inplace)",
    )
    add(p, "max_positions", note="default: the context length")
    add_geometry(p, "attention geometry (defaults: AttentionConfig(), or --hf-config)")
    p.add_argument(
        "--hf-config", metavar="config.json", help="take geometry, scheme and parameters from it (random weights)"
    )
    checkpoint = p.add_argument_group("a checkpoint's layer with its own weights")
    add(checkpoint, "hf_model")
    add(checkpoint, "layer", note="default: 0, or the first layer of --layer-type where layers differ")
    add(checkpoint, "layer_type", note="with --hf-config: which per-layer-type rope_parameters")
    checkpoint.add_argument(
        "--layers",
        metavar="SPEC",
        help="several layers in one command: all, a range 0-3, a list 0,2,5 (per stack in encoder-decoder models; "
        "with --layer-type, that stack or kind only); -o is then a folder: OUT/layerN.onnx + manifest + weights per "
        "layer, one tables file they share, OUT/layers.json",
    )
    checkpoint.add_argument(
        "--via",
        choices=("family", "trace"),
        default=None,
        help="family: posenc's rebuild of the layer (its model type's family); trace: the checkpoint's own "
        "attention module traced as its model calls it, its angles replaced by posenc's tables (any model type). "
        "Default: the family where the model type has one, else the trace",
    )
    add(p, "seed", default=0, note="for the random weights when no --hf-model is given; default 0")
    add(p, "output", required=True, note="the .onnx file; its manifest and weights go beside it")
    p.add_argument("--no-optimize", action="store_true", help="skip the onnxscript optimizer")
    add(p, "position_guard", default=True, note="default on; recorded in the manifest")
    add(p, "json", note="the manifest")
    p.set_defaults(func=_run)


__all__ = ["register"]
