"""Real checkpoints: one layer of a Hugging Face model as posenc's AttentionBlock, and its own transformers module.

Public API::

    from posenc.checkpoints import block_from_hf, load_layer, supported_model_types

    block, loaded = block_from_hf("path/to/checkpoint", layer=3)   # local folder or in-memory transformers model
    loaded.provenance()      # checkpoint, layer, tensor names and sha256 (written into the export manifest)
    loaded.reference()       # the checkpoint's own transformers attention module, called like the block

See :mod:`posenc.checkpoints.family` for how a model family is described (and how to add one),
:mod:`posenc.checkpoints.source` for how tensors are read lazily, :mod:`posenc.checkpoints.reference` for
the transformers reference.
"""

from posenc._lazy import lazy_exports

_EXPORTS = {
    "CheckpointSource": "posenc.checkpoints.source",
    "Family": "posenc.checkpoints.family",
    "LayerPlan": "posenc.checkpoints.family",
    "LoadedLayer": "posenc.checkpoints.load",
    "TransformersReference": "posenc.checkpoints.reference",
    "block_from_hf": "posenc.checkpoints.load",
    "all_families": "posenc.checkpoints.family",
    "family_for": "posenc.checkpoints.family",
    "load_layer": "posenc.checkpoints.load",
    "supported_model_types": "posenc.checkpoints.family",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
