"""Parity of an exported checkpoint layer against the checkpoint's own transformers attention module.

:func:`validate_against_checkpoint` compares the ONNX model (ONNX Runtime, and any other candidate runner) with
the checkpoint's module, each reference named in every report row:

- ``eager-fp64``: posenc's float64 eager rebuild of the exported block (the weights beside the model);
- ``hf-fp32``: the checkpoint's transformers attention module for that layer, float32, with the model's own
  angles — what the user's PyTorch model computes;
- ``hf-fp64, fp64 angles``: the same transformers module in float64, fed float64 angles (rotary schemes);
- for fp16 / bf16 graphs, ``hf-fp16`` / ``hf-bf16``: the module run in the graph's half precision (the user's
  model as it runs in that dtype), held to the scheme's tolerance of the dtype, and the rows
  ``hf-fp64, fp64 angles (≤ 2 × hf-bf16's error)``: the graph against the exact rendering may be at most twice as
  far off as the module in that half precision is.

One rule decides every feed, whatever asked for it (a default shape, the feed ending at the context length, or a
user's ``--shape …@32764``): transformers computes its angles in float32, and where that alone puts ``hf-fp32``
outside the tolerance of ``hf-fp64, fp64 angles`` on a feed and output (``Reference.judged_by``), the rows against
``hf-fp32`` there are informational, with the size of its drift in a note; the float64-angle rendering decides.
Elsewhere they count. Float32 graphs are held to ``1e-5`` (absolute, or relative to the reference) against
transformers, or, where float32 arithmetic alone gets more wrong than that (a wide layer: the module in float32
fed float64 angles, ``hf-fp32, fp64 angles``, against ``hf-fp64, fp64 angles``), to 3 × that error on that feed and
output, with a note (:class:`posenc.validate.compare.Float32Floor`); fp16/bf16 graphs to their scheme's tolerance,
as against posenc's own reference.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.dtypes import torch_dtype
from posenc.errors import ConfigError
from posenc.export.manifest import Manifest, load_manifest
from posenc.export.shapes import Shape
from posenc.export.units import BLOCK_INPLACE
from posenc.provenance import CheckpointWeights, RandomWeights
from posenc.schemes.base import Tolerance
from posenc.trace.boxes import NAME as BOX_INPUT
from posenc.trace.inputs import STREAMS
from posenc.validate.compare import ErrorBound, Float32Floor, Reference
from posenc.validate.feeds import default_shapes
from posenc.validate.parity import EAGER, ParityReport, validate_onnx
from posenc.validate.runners import TorchModuleRunner
from posenc.validate.tolerance import tolerances_for

FP32_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-5)
"""Float32 graphs against transformers' float32 module."""
LONG_TOKENS = 4
"""New tokens of the feed that ends at the context length."""
_INPUTS = ("hidden", "position_ids", "past_key", "past_value")
"""The inputs a reference module takes first, in order; any other cache input of the feed (``past_*``: a traced DSA
layer's indexer keys, a hybrid layer's states) follows in the feed's order, then second streams."""


RunnerFactory = Callable[[Any, str, Sequence[str]], TorchModuleRunner]
"""``(transformers reference, name, output names) -> runner``: one call per feed, or one carrying its cache."""


def _runner(module: Any, name: str, outputs: Sequence[str]) -> TorchModuleRunner:
    def run(feed: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        hidden = torch.from_numpy(feed["hidden"].copy()).float()
        rest = [torch.from_numpy(feed[key].copy()) if key in feed else None for key in _INPUTS[1:]]  # no past: None
        while rest and rest[-1] is None:  # inputs the graph lacks (no past)
            rest.pop()
        rest += [torch.from_numpy(value.copy()) for key, value in feed.items()
                 if key.startswith("past_") and key not in _INPUTS]  # fmt: skip
        given = [value for key, value in feed.items() if key in STREAMS or key == BOX_INPUT]  # traced: last, in order
        rest += [torch.from_numpy(value.copy()) for value in given]
        return dict(zip(outputs, module(hidden, *rest), strict=True))

    return TorchModuleRunner(run, name, list(outputs))


HALF_BOUND_FACTOR = 2.0
"""A half-precision graph may be this many times as far from the exact rendering as the module in that dtype."""


def checkpoint_references(loaded: Any, manifest: Manifest, runner: RunnerFactory = _runner) -> list[Reference]:
    """The transformers references of a loaded checkpoint layer (see the module docstring); ``runner`` wraps each
    module (default: one call per feed)."""
    outputs = manifest.output_names
    dtypes = {o.name: o.dtype for o in manifest.outputs}
    base = tolerances_for(manifest.scheme, dtypes)
    tolerances = {name: FP32_TOLERANCE if dtypes[name] == "float32" else base[name] for name in outputs}
    native = loaded.reference("native", torch.float32)
    exact = loaded.reference("float64", torch.float64)
    description = native.description + "; where its float32 angles drift beyond the tolerance, informational"
    floor = None
    references = []
    if all(dtypes[name] == "float32" for name in outputs):
        rendering = loaded.reference("float64", torch.float32)
        floor = Float32Floor(rendering.name, exact.name)
        if rendering.name != native.name:  # a model without angles: hf-fp32 is its own float32 floor
            what = f"{rendering.description}: float32 arithmetic with exact angles (what any float32 rendering rounds)"
            floor_reference = runner(rendering, rendering.name, outputs)
            references.append(Reference(floor_reference, what, tolerances, informational=True))
    references[:0] = [
        Reference(runner(native, native.name, outputs), description, tolerances, judged_by=exact.name, floor=floor),
        Reference(runner(exact, exact.name, outputs), exact.description, tolerances, floor=floor),
    ]
    if manifest.dtype in ("float16", "bfloat16"):
        half = loaded.reference("native", torch_dtype(manifest.dtype))
        bound = ErrorBound(exact.name, HALF_BOUND_FACTOR)
        what = f"{half.description}: the model as it runs in {manifest.dtype}"
        references.append(Reference(runner(half, half.name, outputs), what, base, bound=bound))
    return references


def _check_same_layer(loaded: Any, manifest: Manifest, checkpoint: str, decode: bool = False) -> None:
    """Refuse to compare a model with a checkpoint it was not exported from (geometry, scheme or weights differ);
    an in-place cache graph only in a decode sequence (its calls take a cache buffer, not a past)."""
    source = manifest.weights.source
    if isinstance(source, RandomWeights):
        raise ConfigError(
            f"the model holds random weights (seed {source.seed}), not {checkpoint}'s; it cannot match the "
            f"checkpoint. Export the layer with `posenc export --hf-model {checkpoint} --layer N -o MODEL.onnx`."
        )
    if manifest.unit == BLOCK_INPLACE and not decode:
        raise ConfigError(
            "an in-place cache graph takes a cache buffer per call; compare it with the checkpoint over a decode "
            "sequence: add --decode."
        )
    if manifest.unit not in ("block", BLOCK_INPLACE):
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
        differences = []
    else:
        differences = _differences(
            {"scheme": manifest.scheme, **manifest.attention}, {"scheme": plan.scheme, **plan.config.to_dict()}
        )
    if differences:
        recorded = f" (its manifest records {_origin(source)})" if isinstance(source, CheckpointWeights) else ""
        raise ConfigError(
            f"the model{recorded} is not layer {plan.layer} of {checkpoint}; these fields differ (model vs "
            f"checkpoint): {'; '.join(differences)}. Pass the checkpoint and layer it was exported from."
        )
    if isinstance(source, CheckpointWeights) and source.tensors and source.tensors != loaded.provenance().tensors:
        raise ConfigError(
            f"the tensors of layer {plan.layer} in {checkpoint} differ from those the model was exported from "
            f"(sha256 recorded in its manifest); re-export it from this checkpoint."
        )


def _differences(
    model: Mapping[str, Any], checkpoint: Mapping[str, Any], template: str = "{key}: {a} vs {b}"
) -> list[str]:
    """``template`` (default ``field: model value vs checkpoint value``) for each field whose values differ (absent:
    ``None``)."""
    keys = [*model, *(key for key in checkpoint if key not in model)]
    return [
        template.format(key=key, a=repr(model.get(key)), b=repr(checkpoint.get(key)))
        for key in keys
        if model.get(key) != checkpoint.get(key)
    ]


def _origin(source: CheckpointWeights) -> str:
    kind = f", {source.layer_type}" if source.layer_type else ""
    return f"{source.checkpoint} ({source.model_type}, layer {source.layer}{kind})"


def _check_same_model(source: CheckpointWeights, checkpoint: Any) -> None:
    """Refuse a checkpoint of another model type than the one the manifest records, before reading its layer (whose
    layer types or geometry would otherwise be the first thing to disagree)."""
    from posenc.checkpoints.source import CheckpointSource

    with CheckpointSource.open(checkpoint) as opened:
        model_type, where = opened.config.get("model_type"), opened.location
    if model_type != source.model_type:
        raise ConfigError(
            f"this model came from another checkpoint: its manifest records {_origin(source)}, and {where} is a "
            f"{model_type or 'model_type-less'} checkpoint. Pass the checkpoint it was exported from."
        )


def _load_matching(
    manifest: Manifest, checkpoint: Any, layer: int | None, layer_type: str | None, decode: bool = False
) -> Any:
    """The checkpoint's layer the model was exported from (default: the one its manifest records), refusing a model
    exported from anything else."""
    from posenc.checkpoints import load_layer
    from posenc.trace.reference import load_traced

    source = manifest.weights.source
    if isinstance(source, CheckpointWeights):
        _check_same_model(source, checkpoint)
        if layer is None:
            layer, layer_type = source.layer, layer_type or source.layer_type
    # a traced export's reference is the module captured again from the checkpoint
    load = load_traced if manifest.trace is not None else load_layer
    loaded = load(checkpoint, layer, layer_type)
    where = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else loaded.location
    # the checkpoint it was exported from, changed since: name the changes; another checkpoint: the differing geometry
    recorded = source if isinstance(source, CheckpointWeights) and manifest.trace is None else None
    if recorded is not None and _same_place(recorded.checkpoint, str(where)):
        _check_unchanged(recorded, manifest, loaded, str(where))
    _check_same_layer(loaded, manifest, str(where), decode)
    if recorded is not None:
        _check_unchanged(recorded, manifest, loaded, str(where))
    return loaded


def _check_unchanged(source: CheckpointWeights, manifest: Manifest, loaded: Any, checkpoint: str) -> None:
    """Refuse, before any numbers, a checkpoint whose positional config (as recorded at export), scheme parameters or
    layer tensors are not what the model was exported from, naming each change (``field X was A, is B``)."""
    from posenc.provenance import positional_fields

    changes = []
    if source.config is not None:
        changes += _differences(
            _flat(source.config), _flat(positional_fields(loaded.hf)), "field {key} was {a}, is {b}"
        )
    if not changes:  # older manifests record no config: the scheme's parameters say the same for the layer
        plan = loaded.plan
        changes += [f"scheme was {manifest.scheme!r}, is {plan.scheme!r}"] if manifest.scheme != plan.scheme else []
        if manifest.scheme == plan.scheme:
            recorded = {key: manifest.params.get(key) for key in plan.params}  # the manifest's: filled with defaults
            changes += _differences(recorded, plan.params, "scheme parameter {key} was {a}, is {b}")
    if source.tensors:
        now = loaded.provenance().tensors
        changes += [
            f"tensor {name} sha256 was {digest[:12]}..., is {now[name][:12]}..."
            for name, digest in source.tensors.items()
            if name in now and now[name] != digest
        ]
    if not changes:
        return
    same = _same_place(source.checkpoint, checkpoint)
    what = (
        "the checkpoint changed since export"
        if same
        else f"{checkpoint} differs from the checkpoint the model was exported from ({_origin(source)})"
    )
    shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more" if len(changes) > 6 else "")
    raise ConfigError(
        f"{what}: {shown}. Re-export the layer from this checkpoint (posenc export --hf-model {checkpoint}), or "
        f"validate against the checkpoint as it was."
    )


def _flat(fields: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects flattened to dotted keys (``rope_parameters.factor``), so a change names its leaf."""
    flat: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _same_place(recorded: str, given: str) -> bool:
    try:
        return Path(recorded).resolve() == Path(given).resolve()
    except (OSError, RuntimeError):
        return recorded == given


def long_shape(manifest: Manifest, context: int) -> Shape:
    """One feed whose last position is the last the model serves: ``min(context, table rows) - 1``."""
    end = min(context, manifest.max_positions or context)
    tokens = min(LONG_TOKENS, end)
    return Shape(1, tokens, 0, start=end - tokens)


def validate_against_checkpoint(
    path: str | os.PathLike[str],
    checkpoint: Any,
    *,
    layer: int | None = None,
    layer_type: str | None = None,
    shapes: Sequence[Shape] | None = None,
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
        long_positions: add a feed ending at the context length (judged by the same rule as every feed).
        runners, providers, seed, quiet: as in :func:`~posenc.validate.parity.validate_onnx`.

    Raises:
        ConfigError: the model was not exported from this checkpoint's layer (random weights, other geometry,
            scheme or tensors), or is not a block.
    """

    path = Path(path)
    manifest = load_manifest(path)
    loaded = _load_matching(manifest, checkpoint, layer, layer_type)
    if shapes is None:
        shapes = [s for s in default_shapes(manifest) if loaded.plan.decoder or s.past == 0]
    shapes = list(shapes)
    if long_positions:
        far = long_shape(manifest, loaded.plan.config.max_position_embeddings)
        if far not in shapes:
            shapes.append(far)
    return validate_onnx(
        path,
        shapes=shapes,
        references=[EAGER, *checkpoint_references(loaded, manifest)],
        runners=runners,
        providers=providers,
        seed=seed,
        quiet=quiet,
        manifest=manifest,
    )


def decode_against_checkpoint(
    path: str | os.PathLike[str],
    checkpoint: Any,
    *,
    layer: int | None = None,
    layer_type: str | None = None,
    schedule: Sequence[Shape] | None = None,
    **decode_options: Any,
) -> Any:
    """The multi-step decode sequence (:func:`posenc.validate.decode.validate_decode`) of an exported checkpoint layer,
    held at every step to the eager block and to the checkpoint's own transformers module carrying its own cache
    (``hf-fp32``, judged by ``hf-fp64, fp64 angles``; ``hf-fp16``/``hf-bf16`` for half graphs), by the one rule.

    Raises:
        ConfigError: the model was not exported from this checkpoint's layer, or the layer is not a decoder's.
    """
    from posenc.validate.decode import decode_outputs, stepping_runner, validate_decode

    manifest = load_manifest(path)
    loaded = _load_matching(manifest, checkpoint, layer, layer_type, decode=True)
    if not loaded.plan.decoder:
        raise ConfigError(
            f"layer {loaded.plan.layer} ({loaded.plan.layer_type}) is not used with a KV cache; decode steps do not "
            f"apply. Validate it without --decode."
        )
    ids = manifest.input("position_ids").shape
    axes = int(ids[0]) if len(ids) == 3 else None

    def stepping(module: Any, name: str, outputs: Sequence[str]) -> TorchModuleRunner:
        steps = decode_outputs(manifest)  # every cache it carries (a traced layer's states too)
        return stepping_runner(module, name, torch.float32, axes, steps)  # the module casts to its own dtype

    references = checkpoint_references(loaded, manifest, stepping)
    return validate_decode([path], schedule, references=references, **decode_options)


__all__ = ["checkpoint_references", "decode_against_checkpoint", "long_shape", "validate_against_checkpoint"]
