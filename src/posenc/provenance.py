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
class CheckpointWeights:
    """A checkpoint layer's weights.

    Attributes:
        checkpoint: the checkpoint folder (or ``<in-memory ...>``).
        model_type: ``config.json``'s ``model_type``.
        family: the posenc checkpoint family that mapped it.
        layer: the layer index (within its stack for encoder-decoder models).
        layer_type: the stack or layer type where the model has several (else ``None``).
        tensors: full checkpoint tensor name -> sha256 of its stored bytes.
    """

    checkpoint: str
    model_type: str
    family: str
    layer: int
    layer_type: str | None
    tensors: dict[str, str]
    kind: Literal["checkpoint"] = "checkpoint"

    def describe(self) -> str:
        where = f"layer {self.layer}" + (f" ({self.layer_type})" if self.layer_type else "")
        return f"checkpoint {self.checkpoint} {where}, {len(self.tensors)} tensors (names and sha256 in the manifest)"


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
