"""posenc: positional-encoding schemes from an exact PyTorch reference to verified ONNX/TensorRT deployments.

Public API (re-exports only), each name imported from its module on first use: ``import posenc`` and
``posenc --help`` load no torch. Heavy optional backends (tensorrt, tensorrt_rtx, triton, transformers)
are imported lazily by the functions that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posenc._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> the module that defines it (a module's own name: the submodule itself).
_EXPORTS: dict[str, str] = {
    "AttentionBlock": "posenc.blocks",
    "AttentionConfig": "posenc.config",
    "BackendUnavailable": "posenc.errors",
    "BuildError": "posenc.errors",
    "ConfigError": "posenc.errors",
    "ExportError": "posenc.errors",
    "MLABlock": "posenc.blocks",
    "MLAConfig": "posenc.blocks",
    "ModelFileError": "posenc.errors",
    "ParityError": "posenc.errors",
    "Placement": "posenc.schemes",
    "PosencError": "posenc.errors",
    "PositionError": "posenc.errors",
    "SchemeSpec": "posenc.schemes",
    "TableMode": "posenc.schemes",
    "build_scheme": "posenc.schemes",
    "from_hf_config": "posenc.config",
    "functional": "posenc.functional",
    "get_spec": "posenc.schemes",
    "scheme_names": "posenc.schemes",
    "specs": "posenc.schemes",
}

__all__ = [
    "AttentionBlock",
    "AttentionConfig",
    "BackendUnavailable",
    "BuildError",
    "ConfigError",
    "ExportError",
    "MLABlock",
    "MLAConfig",
    "ModelFileError",
    "ParityError",
    "Placement",
    "PosencError",
    "PositionError",
    "SchemeSpec",
    "TableMode",
    "__version__",
    "build_scheme",
    "from_hf_config",
    "functional",
    "get_spec",
    "scheme_names",
    "specs",
]

if TYPE_CHECKING:  # what the names are, for type checkers; at run time each is imported on first use
    from posenc import functional
    from posenc.blocks import AttentionBlock, MLABlock, MLAConfig
    from posenc.config import AttentionConfig, from_hf_config
    from posenc.errors import (
        BackendUnavailable,
        BuildError,
        ConfigError,
        ExportError,
        ModelFileError,
        ParityError,
        PosencError,
        PositionError,
    )
    from posenc.schemes import Placement, SchemeSpec, TableMode, build_scheme, get_spec, scheme_names, specs

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
