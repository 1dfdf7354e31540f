"""Parity of an exported checkpoint layer against the checkpoint's own transformers attention module.

:func:`validate_against_checkpoint` compares the ONNX model (ONNX Runtime, and any other candidate runner) with
three references, each named in every report row:

- ``eager-fp64``: posenc's float64 eager rebuild of the exported block (the weights beside the model);
- ``hf-fp32``: the checkpoint's transformers attention module for that layer, float32, with the model's own
  angles — what the user's PyTorch model computes;
- ``hf-fp64, fp64 angles``: the same transformers module in float64, fed float64 angles (rotary schemes).

At ordinary shapes (prefill, and for decoders a decode step after a cache and a prefill after one) all three
count. At positions near the context length transformers' own float32 angles drift (about ``position * 2**-23``
rad), so there ``hf-fp32`` is reported as informational and the float64-angle rendering carries the verdict.
Float32 graphs are held to ``1e-5`` (absolute, or relative to the reference) against transformers; fp16/bf16
graphs to their scheme's tolerance, as against posenc's own reference.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.errors import ConfigError
from posenc.export.manifest import Manifest, load_manifest
from posenc.export.units import FeedShape
from posenc.provenance import CheckpointWeights, RandomWeights
from posenc.schemes.base import Tolerance
from posenc.validate.compare import Reference
from posenc.validate.feeds import default_shapes
from posenc.validate.parity import EAGER, ParityReport, validate_onnx
from posenc.validate.runners import TorchModuleRunner
from posenc.validate.tolerance import tolerances_for

FP32_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-5)
"""Float32 graphs against transformers' float32 module."""
LONG_TOKENS = 4
"""New tokens of the feed that ends at the context length."""
_INPUTS = ("hidden", "position_ids", "past_key", "past_value")


def _runner(module: Any, name: str, outputs: Sequence[str]) -> TorchModuleRunner:
    def run(feed: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        tensors = [torch.from_numpy(feed[key].copy()) for key in _INPUTS]
        tensors[0] = tensors[0].float()
        return dict(zip(outputs, module(*tensors), strict=True))

    return TorchModuleRunner(run, name, list(outputs))


def checkpoint_references(loaded: Any, manifest: Manifest, *, informational_native: bool = False) -> list[Reference]:
    """The transformers references of a loaded checkpoint layer (see the module docstring)."""
    outputs = manifest.output_names
    dtypes = {o.name: o.dtype for o in manifest.outputs}
    base = tolerances_for(manifest.scheme, dtypes)
    tolerances = {name: FP32_TOLERANCE if dtypes[name] == "float32" else base[name] for name in outputs}
    native = loaded.reference("native", torch.float32)
    exact = loaded.reference("float64", torch.float64)
    name, description = native.name, native.description
    if informational_native:
        name += " far"
        description += "; far from the start its float32 angles drift (about position * 2**-23 rad)"
    return [
        Reference(_runner(native, name, outputs), description, tolerances, informational_native),
        Reference(_runner(exact, exact.name, outputs), exact.description, tolerances),
    ]


def _check_same_layer(loaded: Any, manifest: Manifest, checkpoint: str) -> None:
    """Refuse to compare a model with a checkpoint it was not exported from (geometry, scheme or weights differ)."""
    source = manifest.weights.source
    if isinstance(source, RandomWeights):
        raise ConfigError(
            f"the model holds random weights (seed {source.seed}), not {checkpoint}'s; it cannot match the "
            f"checkpoint. Export the layer with `posenc export --hf-model {checkpoint} --layer N -o MODEL.onnx`."
        )
    if manifest.unit != "block":
        raise ConfigError(
            f"--against-hf compares attention blocks with the checkpoint's attention module; {manifest.unit!r} "
            f"exports hold the positional op alone. Export with --unit block."
        )
    plan = loaded.plan
    if manifest.trace is not None:
        if manifest.trace.model_type != loaded.provenance().model_type or manifest.trace.layer != plan.layer:
            raise ConfigError(
                f"the model traces layer {manifest.trace.layer} of a {manifest.trace.model_type} model, not layer "
                f"{plan.layer} of {checkpoint}; pass the checkpoint and layer it was exported from."
            )
    elif manifest.attention != plan.config.to_dict() or manifest.scheme != plan.scheme:
        raise ConfigError(
            f"the model ({manifest.scheme}, {manifest.attention}) is not layer {plan.layer} of {checkpoint} "
            f"({plan.scheme}, {plan.config.to_dict()}); pass the checkpoint and layer it was exported from."
        )
    if isinstance(source, CheckpointWeights) and source.tensors and source.tensors != loaded.provenance().tensors:
        raise ConfigError(
            f"the tensors of layer {plan.layer} in {checkpoint} differ from those the model was exported from "
            f"(sha256 recorded in its manifest); re-export it from this checkpoint."
        )


def long_shape(manifest: Manifest, context: int) -> FeedShape:
    """One feed whose last position is the last the model serves: ``min(context, table rows) - 1``."""
    end = min(context, manifest.max_positions or context)
    tokens = min(LONG_TOKENS, end)
    return FeedShape(1, tokens, 0, start=end - tokens)


def validate_against_checkpoint(
    path: str | os.PathLike[str],
    checkpoint: Any,
    *,
    layer: int | None = None,
    layer_type: str | None = None,
    shapes: Sequence[FeedShape] | None = None,
    long_positions: bool = True,
    runners: Sequence[Any] = ("onnxrt",),
    providers: Sequence[str] | None = None,
    seed: int = 0,
    quiet: bool = True,
) -> ParityReport:
    """Compare an exported layer with the checkpoint's own transformers module (and posenc's float64 rebuild).

    Args:
        path: the ONNX file exported from the checkpoint (``posenc export --hf-model``).
        checkpoint: the checkpoint folder or in-memory transformers model.
        layer, layer_type: the layer; default: the one recorded in the model's manifest.
        shapes: ordinary shapes (default: :func:`~posenc.validate.feeds.default_shapes`, without a cache for
            encoder layers).
        long_positions: add a feed ending at the context length (see the module docstring).
        runners, providers, seed, quiet: as in :func:`~posenc.validate.parity.validate_onnx`.

    Raises:
        ConfigError: the model was not exported from this checkpoint's layer (random weights, other geometry,
            scheme or tensors), or is not a block.
    """
    from posenc.checkpoints import load_layer
    from posenc.trace.reference import load_traced

    path = Path(path)
    manifest = load_manifest(path)
    source = manifest.weights.source
    if layer is None and isinstance(source, CheckpointWeights):
        layer, layer_type = source.layer, layer_type or source.layer_type
    traced = manifest.trace is not None  # a traced export: its reference is the module captured again
    loaded = load_traced(checkpoint, layer, layer_type) if traced else load_layer(checkpoint, layer, layer_type)
    where = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else loaded.location
    _check_same_layer(loaded, manifest, str(where))
    if shapes is None:
        shapes = [s for s in default_shapes(manifest) if loaded.plan.decoder or s.past == 0]

    def run(shapes: Sequence[FeedShape], references: Sequence[Reference | str]) -> ParityReport:
        return validate_onnx(
            path,
            shapes=shapes,
            references=references,
            runners=runners,
            providers=providers,
            seed=seed,
            quiet=quiet,
            manifest=manifest,
        )

    report = run(shapes, [EAGER, *checkpoint_references(loaded, manifest)])
    if long_positions:
        far = [long_shape(manifest, loaded.plan.config.max_position_embeddings)]
        extra = run(far, [EAGER, *checkpoint_references(loaded, manifest, informational_native=True)])
        report.rows += extra.rows
        report.references += [ref for ref in extra.references if ref.informational]
        report.notes.append(
            f"{far[0].label}: positions up to {far[0].last}, where transformers' own float32 angles drift; rows "
            f"against {extra.references[1].name} there are informational, the float64-angle rendering decides."
        )
    return report


__all__ = ["checkpoint_references", "long_shape", "validate_against_checkpoint"]
