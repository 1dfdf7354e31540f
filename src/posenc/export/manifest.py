"""The manifest that travels beside every exported ONNX file (``model.onnx`` -> ``model.manifest.json``).

It says what the graph is, so that later stages (graph passes, engine builds, validation, benchmarks)
read it instead of asking the user again. Fields (JSON keys):

``format``                 ``"posenc.export/1"``
``scheme``, ``family``, ``placement``, ``params``   registered scheme name and its resolved parameters
``unit``                   ``"op"`` (the positional op alone), ``"op-3d"`` (RoPE on ``[B, S, H*D]``) or ``"block"``
``table_mode``             ``"precomputed"`` or ``"dynamic"``
``dtype``, ``table_dtype`` activation/weight dtype of the graph; dtype of position tables (float32)
``opset``                  ONNX opset of the default domain
``attention``              :class:`posenc.config.AttentionConfig` as a dict
``max_positions``          exclusive bound on position ids the graph serves (precomputed tables), or null
``build_max_positions``    ``max_positions`` argument the module was built with (rows of its tables)
``dynamic_dims``           name -> ``{"min", "max", "sample"}`` (``batch``, ``seq``, ``past``, ``kv_seq``)
``inputs``, ``outputs``    list of ``{"name", "dtype", "shape", "layout", "role"}`` in graph order;
                           shapes use the dim names above (outputs may hold expressions like ``past + seq``)
``onnx_sha256``            sha256 of the ONNX file's bytes
``weights``                ``{"path", "sha256", "format", "tables", "source"}``: the module's ``state_dict``
                           (safetensors) beside the model, from which ``posenc validate`` rebuilds the eager
                           reference; ``tables`` lists the position-table keys (recomputed, not copied);
                           ``source`` says where the weights came from: ``{"kind": "checkpoint", "checkpoint",
                           "model_type", "family", "layer", "layer_type", "tensors": {name: sha256}}``,
                           ``{"kind": "random", "seed"}`` or ``{"kind": "module", "class"}``
``source``                 ``{"module", "posenc_sha256"}``: the exported class and a hash of the posenc
                           sources it runs
``versions``               torch, onnx, onnxruntime, onnxscript, polygraphy, posenc, python
``created``                ISO-8601 UTC time
``notes``                  free-form remarks of the exporter (e.g. complex ops rewritten)

Input roles: ``activation`` (float tensors), ``positions`` (int64 position ids that index tables),
``cache`` (past keys/values). Dim names: ``batch`` B, ``seq`` S (new tokens / queries), ``past`` P
(cached tokens), ``kv_seq`` keys (``P + S`` in a block).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from posenc.errors import ConfigError, ModelFileError
from posenc.export.files import manifest_path_for, sha256_file, weights_path_for, write_text_atomic

MANIFEST_FORMAT = "posenc.export/1"

DTYPE_ALIASES: Mapping[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "float32": "float32",
    "fp16": "float16",
    "half": "float16",
    "float16": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp64": "float64",
    "float64": "float64",
    "double": "float64",
    "int64": "int64",
}
_TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
}


def dtype_name(dtype: str | torch.dtype) -> str:
    """Canonical dtype name (``float32``, ``float16``, ``bfloat16``, ``float64``, ``int64``).

    Accepts torch dtypes and the aliases fp32/fp16/bf16/half/float/double.
    """
    key = str(dtype).removeprefix("torch.").lower()
    if key not in DTYPE_ALIASES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of fp32, fp16, bf16 (or float32, float16, bfloat16).")
    return DTYPE_ALIASES[key]


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name or alias (see :func:`dtype_name`)."""
    return _TORCH_DTYPES[dtype_name(dtype)]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One graph input or output.

    Attributes:
        name: ONNX value name.
        dtype: canonical dtype name.
        shape: ints and dim names (or expressions of them, e.g. ``"past + seq"``).
        layout: axis meaning, e.g. ``"[B, H, S, D]"``.
        role: ``activation``, ``positions``, ``cache`` or ``output``.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    layout: str
    role: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "layout": self.layout,
            "role": self.role,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=tuple(data["shape"]),
            layout=str(data.get("layout", "")),
            role=str(data.get("role", "activation")),
        )


@dataclasses.dataclass(frozen=True)
class DimRange:
    """Range of one dynamic dimension: ``min <= size <= max`` (``max`` None = unbounded); ``sample`` traced."""

    min: int
    max: int | None
    sample: int

    def to_dict(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max, "sample": self.sample}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DimRange:
        return cls(int(data["min"]), None if data.get("max") is None else int(data["max"]), int(data["sample"]))


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What an exported ONNX file is (see the module docstring for the JSON layout)."""

    scheme: str
    family: str
    placement: str
    params: dict[str, Any]
    unit: str
    table_mode: str
    dtype: str
    table_dtype: str
    opset: int
    attention: dict[str, Any]
    max_positions: int | None
    build_max_positions: int
    dynamic_dims: dict[str, DimRange]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    onnx_sha256: str
    weights: dict[str, Any]
    source: dict[str, Any]
    versions: dict[str, str]
    created: str
    notes: tuple[str, ...] = ()
    format: str = MANIFEST_FORMAT
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Records later stages add (e.g. ``optimized`` from ``posenc optimize``); kept through load and save."""

    # -- lookups ---------------------------------------------------------------------------------

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ConfigError(f"the model has no input {name!r}; its inputs are {self.input_names}.")

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    def attention_config(self):  # type: ignore[no-untyped-def]
        """The :class:`posenc.config.AttentionConfig` the module was built with."""
        from posenc.config import AttentionConfig

        return AttentionConfig.from_dict(self.attention)

    # -- (de)serialization -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "scheme": self.scheme,
            "family": self.family,
            "placement": self.placement,
            "params": _jsonable(self.params),
            "unit": self.unit,
            "table_mode": self.table_mode,
            "dtype": self.dtype,
            "table_dtype": self.table_dtype,
            "opset": self.opset,
            "attention": dict(self.attention),
            "max_positions": self.max_positions,
            "build_max_positions": self.build_max_positions,
            "dynamic_dims": {k: v.to_dict() for k, v in self.dynamic_dims.items()},
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "onnx_sha256": self.onnx_sha256,
            "weights": dict(self.weights),
            "source": dict(self.source),
            "versions": dict(self.versions),
            "created": self.created,
            "notes": list(self.notes),
            **_jsonable(self.extras),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        if data.get("format") != MANIFEST_FORMAT:
            raise ModelFileError(
                f"manifest format {data.get('format')!r} is not {MANIFEST_FORMAT!r}; re-export the model with "
                f"this posenc version (`posenc export ...`)."
            )
        try:
            return cls(
                scheme=str(data["scheme"]),
                family=str(data["family"]),
                placement=str(data["placement"]),
                params=dict(data["params"]),
                unit=str(data["unit"]),
                table_mode=str(data["table_mode"]),
                dtype=str(data["dtype"]),
                table_dtype=str(data["table_dtype"]),
                opset=int(data["opset"]),
                attention=dict(data["attention"]),
                max_positions=None if data["max_positions"] is None else int(data["max_positions"]),
                build_max_positions=int(data["build_max_positions"]),
                dynamic_dims={k: DimRange.from_dict(v) for k, v in data["dynamic_dims"].items()},
                inputs=tuple(TensorSpec.from_dict(s) for s in data["inputs"]),
                outputs=tuple(TensorSpec.from_dict(s) for s in data["outputs"]),
                onnx_sha256=str(data["onnx_sha256"]),
                weights=dict(data["weights"]),
                source=dict(data.get("source", {})),
                versions=dict(data.get("versions", {})),
                created=str(data.get("created", "")),
                notes=tuple(data.get("notes", ())),
                extras={k: v for k, v in data.items() if k not in _CORE_FIELDS},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelFileError(
                f"the manifest lacks or has a malformed field ({exc!r}); re-export the model (`posenc export ...`)."
            ) from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the manifest JSON atomically."""
        return write_text_atomic(path, self.to_json())


_CORE_FIELDS = frozenset(
    {
        "format", "scheme", "family", "placement", "params", "unit", "table_mode", "dtype", "table_dtype", "opset",
        "attention", "max_positions", "build_max_positions", "dynamic_dims", "inputs", "outputs", "onnx_sha256",
        "weights", "source", "versions", "created", "notes",
    }
)  # fmt: skip


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _resolve_paths(path: str | os.PathLike[str]) -> tuple[Path | None, Path]:
    """``(onnx_path or None, manifest_path)`` for a path to either file."""
    path = Path(path)
    if path.name.endswith(".manifest.json"):
        onnx_path = path.with_name(path.name.removesuffix(".manifest.json") + ".onnx")
        return (onnx_path if onnx_path.exists() else None), path
    return path, manifest_path_for(path)


def load_manifest(path: str | os.PathLike[str], *, verify: bool = True) -> Manifest:
    """Read the manifest of an exported model.

    Args:
        path: the ONNX file (its ``.manifest.json`` beside it is read) or the manifest itself.
        verify: check that the ONNX file (when present) and the weights file hash to what the
            manifest recorded.

    Raises:
        ModelFileError: the manifest is missing, unreadable, or does not match its model or weights.
    """
    onnx_path, manifest_path = _resolve_paths(path)
    if onnx_path is not None and not onnx_path.exists():
        raise ModelFileError(f"{onnx_path} does not exist; pass the path of an exported .onnx file.")
    if not manifest_path.exists():
        raise ModelFileError(
            f"no manifest {manifest_path.name} beside {onnx_path or manifest_path}; posenc writes one on export. "
            f"Re-export with `posenc export ... -o {onnx_path or 'model.onnx'}` (a manifest cannot be guessed)."
        )
    manifest = Manifest.from_dict(read_manifest_json(manifest_path))
    if verify:
        verify_files(manifest, onnx_path, manifest_path)
    return manifest


def read_manifest_json(manifest_path: Path) -> dict[str, Any]:
    """The JSON object stored in ``manifest_path`` (any format: export, graphs or engine manifests).

    Raises:
        ModelFileError: the file is unreadable, not JSON, or not a JSON object.
    """
    try:
        data = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{manifest_path} is not readable JSON ({exc}); re-export the model.") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{manifest_path} does not hold a JSON object; re-export the model.")
    return data


def verify_files(manifest: Manifest, onnx_path: Path | None, manifest_path: Path) -> None:
    """Check the hashes of the ONNX file and the weights file against the manifest."""
    if onnx_path is not None:
        actual = sha256_file(onnx_path)
        if actual != manifest.onnx_sha256:
            raise ModelFileError(
                f"{onnx_path} does not match its manifest {manifest_path.name} (sha256 {actual[:12]}... != "
                f"{manifest.onnx_sha256[:12]}...): the file was modified, truncated or replaced. Re-export it "
                f"(`posenc export ...`), or restore the file the manifest describes."
            )
    weights = weights_file(manifest, manifest_path)
    if not weights.exists():
        raise ModelFileError(
            f"weights file {weights} named by {manifest_path.name} is missing; keep it beside the model or re-export."
        )
    actual = sha256_file(weights)
    if actual != manifest.weights.get("sha256"):
        raise ModelFileError(
            f"{weights} does not match the sha256 in {manifest_path.name}; it was modified or replaced. Re-export."
        )


def weights_file(manifest: Manifest, manifest_path: str | os.PathLike[str]) -> Path:
    """Absolute path of the weights file (stored relative to the manifest's directory)."""
    return Path(manifest_path).parent / str(manifest.weights.get("path", weights_path_for("model.onnx").name))
