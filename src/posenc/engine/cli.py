"""``posenc build``: a TensorRT engine (+ manifest) from an ONNX file."""

from __future__ import annotations

import argparse
import json

from posenc.cli_args import add, path_arg
from posenc.cli_parser import add_alias

EPILOG = """\
examples:
  posenc build block.trt.onnx --engine-target sm89 -o block.engine
  posenc build block.trt.onnx --engine-target sm89 --engine-target sm120 --profile seq=1:256:2048 -o block.engine
  posenc build block.trt.onnx --trt-backend tensorrt --timing-cache trt.cache -o block.engine   # on a GPU

Backend: datacenter `tensorrt` when importable (builds for the GPU it runs on), else `tensorrt_rtx`
(ahead of time, no GPU needed; targets sm75 sm80 sm86 sm89 sm120). Profiles default to the ranges in the
model's manifest, sized to the model: a prefill profile (profile 0: any call the model serves, up to its
context length) and, for a block with a cache, a decode profile (1-16 new tokens after up to context - 1 cached);
build prints them. --profile NAME=MIN:OPT:MAX overrides one dimension in every profile, within the manifest's range.
A graph with posenc plugin nodes (`optimize --rope plugin`) is refused where TensorRT has no such plugin
(TensorRT-RTX has none; it would inline the plugin's ONNX function, slower than --rope fused) unless
--inline-plugins. Writes OUT and OUT.manifest.json; a failed build writes neither.
exit status: 0 built; 2 missing backend, bad target/profile, unparsable graph, inlined plugin or failed build."""


def _build(args: argparse.Namespace) -> int:
    from posenc.artifacts.files import check_apart
    from posenc.engine.build import build_engine
    from posenc.engine.profiles import format_profiles

    check_apart([(args.output, "engine"), (args.timing_cache, "file")], [(args.model, "model")])

    result = build_engine(
        args.model,
        args.output,
        targets=args.engine_target,
        profile=args.profile,
        backend=args.trt_backend,
        timing_cache=args.timing_cache,
        workspace_bytes=None if args.workspace_mib is None else args.workspace_mib * (1 << 20),
        inline_plugins=args.inline_plugins,
    )
    manifest = result.manifest
    if args.json:
        print(json.dumps({"path": str(result.path), "manifest": str(result.manifest_path), **manifest.to_dict()}))
        return 0
    targets = ", ".join(manifest.targets) or manifest.targets_note
    print(
        f"wrote {result.path} ({manifest.engine_bytes} bytes, {manifest.backend} {manifest.backend_version}, "
        f"targets {targets}, {manifest.precision}, {manifest.build_seconds:.2f} s) + {result.manifest_path.name}"
    )
    if manifest.inlined_plugin_layers:
        from pathlib import Path

        from posenc.engine.network import fused_remedy

        print(
            f"warning: the posenc plugin is inlined as its ONNX function ({manifest.inlined_plugin_layers} layers, "
            f"--inline-plugins), slower than TensorRT's rotary layer: {fused_remedy(Path(args.model))}"
        )
    names = manifest.profile_names or tuple(f"profile {i}" for i in range(len(manifest.profiles)))
    print(f"optimization profiles (min:opt:max): {format_profiles(dict(zip(names, manifest.profiles, strict=True)))}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from posenc.engine.backend import BACKENDS

    p = subparsers.add_parser(
        "build",
        help="build a TensorRT engine (tensorrt or tensorrt_rtx) from an ONNX file",
        description="Parse ONNX into a strongly typed TensorRT network (precision from the graph's dtypes), mark "
        "fp32 attention decomposable, build for the given compute capabilities with a profile from the manifest.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", type=path_arg, help="ONNX file (ideally `posenc optimize --target trt` output)")
    add(p, "output", required=True, note="the engine file; its manifest goes beside it")
    add(p, "engine_target", repeat=True, note="default: the backend's default")
    add_alias(p, "--target", "engine_target", use="--engine-target", append=True)
    p.add_argument("--profile", action="append", default=[], help="dimension range NAME=MIN:OPT:MAX (repeatable)")
    p.add_argument(
        "--trt-backend",
        choices=BACKENDS,
        help="which TensorRT builds the engine (default: tensorrt if importable, else tensorrt_rtx)",
    )
    add_alias(p, "--backend", "trt_backend", use="--trt-backend", choices=BACKENDS)
    p.add_argument("--timing-cache", type=path_arg, help="timing cache file (datacenter TensorRT; RTX has none)")
    p.add_argument("--workspace-mib", type=int, help="builder workspace limit in MiB")
    p.add_argument(
        "--inline-plugins",
        action="store_true",
        help="build a graph with posenc plugin nodes where TensorRT has no such plugin (TensorRT-RTX has none) by "
        "inlining their ONNX function: slower than --rope fused; default: refuse",
    )
    add(p, "json", note="the engine manifest and the paths written")
    p.set_defaults(func=_build)
