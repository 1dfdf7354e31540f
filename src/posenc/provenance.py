"""Where an exported model's weights came from: the manifest's ``weights.source`` record.

Three kinds, told apart by ``kind``:

- :class:`CheckpointWeights`: a checkpoint's layer (:meth:`posenc.checkpoints.LoadedLayer.provenance`), with
  every tensor's checkpoint name and sha256;
- :class:`RandomWeights`: fresh random weights of a scheme or block built from its name, and their seed;
- :class:`ModuleWeights`: a module built by the caller (its class).

They sit below :mod:`posenc.checkpoints` and :mod:`posenc.export`, which both use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from posenc.records import field


@dataclasses.dataclass(frozen=True)
class Quantization:
    """A quantized checkpoint's ``quantization_config``, as posenc read the layer's tensors from it
    (:mod:`posenc.checkpoints.quantized`).

    Attributes:
        method: ``quantization_config.quant_method`` (``fp8``, ``mxfp4``).
        block_size: fp8's ``weight_block_size`` (``[rows, columns]`` of one scale's block; None: one scale per
            tensor), else None.
        dequantized: full checkpoint names of the tensors dequantized to float32 (their sha256 in ``tensors`` is that
            of the dequantized float32 values); tensors the checkpoint stores unquantized are read as stored.
    """

    method: str
    block_size: list[int] | None
    dequantized: list[str]

    def describe(self) -> str:
        block = f" blocks {self.block_size[0]}x{self.block_size[1]}" if self.block_size else ""
        if not self.dequantized:
            return f"{self.method}-quantized checkpoint, the layer's tensors stored unquantized"
        return f"{len(self.dequantized)} tensors dequantized from {self.method}{block} to float32"


@dataclasses.dataclass(frozen=True)
class CheckpointWeights:
    """A checkpoint layer's weights.

    Attributes:
        checkpoint: the checkpoint folder (or ``<in-memory ...>``).
        model_type: ``config.json``'s ``model_type``.
        family: the posenc checkpoint family that mapped it.
        layer: the layer index (within its stack for encoder-decoder models).
        layer_type: the stack or layer type where the model has several (else ``None``).
        tensors: full checkpoint tensor name -> sha256 of its stored bytes.
        weights_file: the weights file read, relative to the checkpoint (``model.safetensors``, a shard index, ...;
            transformers' precedence where several are present); absent for in-memory models and older manifests.
        config: the checkpoint config's positional fields at export (:func:`positional_fields`), so a later
            ``validate --against-hf`` can say which changed; absent in older manifests.
        quantization: how a quantized checkpoint's tensors were read (None: not quantized); ``tensors`` then hashes
            the float32 values of the tensors it dequantized.
    """

    checkpoint: str
    model_type: str
    family: str
    layer: int
    layer_type: str | None
    tensors: dict[str, str]
    kind: Literal["checkpoint"] = "checkpoint"
    weights_file: str | None = field(optional=True, default=None)
    config: dict[str, Any] | None = field(optional=True, default=None)
    quantization: Quantization | None = field(optional=True, default=None)

    def describe(self) -> str:
        where = f"layer {self.layer}" + (f" ({self.layer_type})" if self.layer_type else "")
        read = f" read from {self.weights_file}" if self.weights_file else ""
        quantized = f"; {self.quantization.describe()}" if self.quantization else ""
        return (
            f"checkpoint {self.checkpoint} {where}, {len(self.tensors)} tensors{read} (names and sha256 in the "
            f"manifest){quantized}"
        )


@dataclasses.dataclass(frozen=True)
class RandomWeights:
    """Fresh random weights of a scheme or block built from its name (not a trained model)."""

    seed: int
    kind: Literal["random"] = "random"

    def describe(self) -> str:
        return f"RANDOM (seed {self.seed}): not a trained model; export a checkpoint's layer with --hf-model DIR"


@dataclasses.dataclass(frozen=True)
class ModuleWeights:
    """Weights of a module the caller built (``export_onnx(module=...)`` without provenance)."""

    module_class: str = field(key="class")
    kind: Literal["module"] = "module"

    def describe(self) -> str:
        return f"from a module built by the caller ({self.module_class})"


POSITIONAL_FIELDS = (
    "rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base", "partial_rotary_factor", "rotary_pct",
    "rotary_dim", "max_position_embeddings", "original_max_position_embeddings", "n_positions", "max_seq_len",
    "sliding_window", "attention_chunk_size", "position_embedding_type", "alibi", "layer_types",
    "relative_attention_num_buckets", "relative_attention_max_distance", "position_buckets",
    "max_relative_positions",
)  # fmt: skip
"""The config fields that decide a layer's positions (scheme, its parameters, context, windows)."""


def positional_fields(config: Mapping[str, Any] | Any) -> dict[str, Any]:
    """The :data:`POSITIONAL_FIELDS` a config (a dict, or a transformers config object: its ``to_dict()``) sets."""
    data = config if isinstance(config, Mapping) else config.to_dict()
    return {key: data[key] for key in POSITIONAL_FIELDS if data.get(key) is not None}


WeightsSource = CheckpointWeights | RandomWeights | ModuleWeights
"""The manifest's ``weights.source``."""


def describe_weights(source: WeightsSource) -> str:
    """One line saying where a model's weights came from."""
    return source.describe()
