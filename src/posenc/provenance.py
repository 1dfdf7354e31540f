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
from typing import Literal

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
        tensors: full checkpoint tensor name -> sha256 of its stored bytes (of its float32 values where
            ``quantization`` says it was dequantized).
        quantization: how a quantized checkpoint's tensors were read (None: not quantized).
    """

    checkpoint: str
    model_type: str
    family: str
    layer: int
    layer_type: str | None
    tensors: dict[str, str]
    kind: Literal["checkpoint"] = "checkpoint"
    quantization: Quantization | None = field(optional=True, default=None)

    def describe(self) -> str:
        where = f"layer {self.layer}" + (f" ({self.layer_type})" if self.layer_type else "")
        quantized = f"; {self.quantization.describe()}" if self.quantization else ""
        return (
            f"checkpoint {self.checkpoint} {where}, {len(self.tensors)} tensors (names and sha256 in the manifest)"
            f"{quantized}"
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


WeightsSource = CheckpointWeights | RandomWeights | ModuleWeights
"""The manifest's ``weights.source``."""


def describe_weights(source: WeightsSource) -> str:
    """One line saying where a model's weights came from."""
    return source.describe()
