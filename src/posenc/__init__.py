"""posenc: positional-encoding schemes from an exact PyTorch reference to verified ONNX/TensorRT deployments.

Public API (re-exports only). Heavy optional backends (tensorrt, tensorrt_rtx, triton, transformers)
are imported lazily by the functions that need them.
"""

from posenc import functional
from posenc.blocks import AttentionBlock
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
from posenc.mla import MLABlock, MLAConfig
from posenc.schemes import Placement, SchemeSpec, TableMode, build_scheme, get_spec, scheme_names, specs

__version__ = "0.1.0"

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
