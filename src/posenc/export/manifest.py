"""The manifest that travels beside every exported ONNX file (``model.onnx`` -> ``model.manifest.json``).

It says what the graph is, so that later stages (graph passes, engine builds, validation, benchmarks)
read it instead of asking the user again. Fields (JSON keys):

``format``                 ``"posenc.export/1"``
``scheme``, ``family``, ``placement``, ``params``   registered scheme name and its resolved parameters
``unit``                   ``"op"`` (the positional op alone), ``"op-3d"`` (RoPE on ``[B, S, H*D]``), ``"block"``
                           or ``"block-inplace"`` (the block over a preallocated cache)
``table_mode``             ``"precomputed"`` or ``"dynamic"``
``dtype``, ``table_dtype`` activation/weight dtype of the graph; dtype of position tables (float32)
``opset``                  ONNX opset of the default domain
``attention``              :class:`posenc.config.AttentionConfig` as a dict (an MLA block's
                           :class:`posenc.blocks.mla.MLAConfig`, with ``"block": "mla"``)
``max_positions``          exclusive bound on position ids the graph serves (precomputed tables), or null
``build_max_positions``    ``max_positions`` argument the module was built with (rows of its tables)
``dynamic_dims``           name -> ``{"min", "max", "sample"}`` (``batch``, ``seq``, ``past``, ``kv_seq``)
``inputs``, ``outputs``    list of ``{"name", "dtype", "shape", "layout", "role"}`` in graph order;
                           shapes use the dim names above (outputs may hold expressions like ``past + seq``)
``onnx_sha256``            sha256 of the ONNX file's bytes
``weights``                ``{"path", "sha256", "format", "tables", "source"[, "tables_file"]}``: the module's
                           ``state_dict`` (safetensors) beside the model, from which ``posenc validate`` rebuilds
                           the eager reference; ``tables`` lists the position-table keys (recomputed, not copied);
                           ``source`` says where the weights came from: ``{"kind": "checkpoint", "checkpoint",
                           "model_type", "family", "layer", "layer_type", "tensors": {name: sha256}}``,
                           ``{"kind": "random", "seed"}`` or ``{"kind": "module", "class"}``; ``tables_file``
                           ``{"path", "sha256"}``: the tables file the layers of one ``--layers`` export share
``source``                 ``{"module", "posenc_sha256", "files"}``: the exported class and a hash of the
                           posenc sources it runs
``versions``               torch, onnx, onnxruntime, onnxscript, polygraphy, posenc, python
``created``                ISO-8601 UTC time
``notes``                  free-form remarks of the exporter (e.g. complex ops rewritten)
``position_guard``         whether the graph guards its positions (:func:`posenc.functional.position_guard`: an
                           invalid position raises in ONNX Runtime and gives NaN in TensorRT); absent: false
``optimized``              only in graphs written by ``posenc optimize``: ``{"target", "rope", "passes",
                           "parity", "source_onnx", "source_sha256"[, "previous"][, "shape_rules"]}``
                           (:class:`OptimizedRecord`; ``shape_rules``: what the graph's fused kernels accept beyond
                           ``dynamic_dims``, :mod:`posenc.export.shape_rules`)
``trace``                  only in traced exports (``posenc export --via trace``): the traced layer (model type,
                           config, modules, how the model calls them) and which positional parts posenc replaced
                           with its tables, which it kept and why (:class:`posenc.trace.record.TraceRecord`)

Each JSON object is a record class below, read strictly by :func:`posenc.records.from_json`: a missing or
unknown key is a :class:`~posenc.errors.ModelFileError` that says to re-export.

Input roles: ``activation`` (float tensors), ``positions`` (int64 position ids that index tables),
``cache`` (past keys/values, or a preallocated cache), ``length`` (filled cache slots per row), ``boxes`` (a
traced document model's boxes per token, ``bbox [B, S, 4]``: :mod:`posenc.trace.boxes`). Dim names:
``batch`` B, ``seq`` S (new tokens / queries), ``past`` P (cached tokens), ``kv_seq`` keys (``P + S`` in a block).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from posenc.artifacts.files import manifest_path_for, reading, write_text_atomic
from posenc.artifacts.paths import input_file, member, sha256_file
from posenc.errors import ConfigError, ModelFileError
from posenc.provenance import WeightsSource
from posenc.records import Document, field
from posenc.trace.record import TraceRecord

MANIFEST_FORMAT = "posenc.export/1"
REEXPORT = "re-export the model with this posenc version (`posenc export ...`)"
"""The remedy of every unreadable manifest: a manifest cannot be repaired by hand or guessed."""


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


@dataclasses.dataclass(frozen=True)
class DimRange:
    """Range of one dynamic dimension: ``min <= size <= max`` (``max`` None = unbounded); ``sample`` traced."""

    min: int
    max: int | None
    sample: int


@dataclasses.dataclass(frozen=True)
class FileRecord:
    """A file beside the manifest that its graph reads: name (relative to the manifest's folder) and sha256."""

    path: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class WeightsRecord:
    """The weights file beside the model (the module's ``state_dict``) and where the weights came from.

    Attributes:
        path: file name, relative to the manifest's folder.
        sha256: hex sha256 of the file.
        format: ``safetensors`` (or the legacy ``torch.save(state_dict)``).
        tables: state-dict keys that are position tables (recomputed by a rebuild, not copied).
        source: checkpoint provenance, random seed or the caller's module (:mod:`posenc.provenance`).
        tables_file: where the graph's position tables are, when not in ``path``: the one tables file that every
            layer of a ``posenc export --layers`` folder shares (:mod:`posenc.export.layers`); else None.
    """

    path: str
    sha256: str
    format: str
    tables: tuple[str, ...]
    source: WeightsSource
    tables_file: FileRecord | None = field(optional=True, default=None)


@dataclasses.dataclass(frozen=True)
class SourceRecord:
    """The exported class and a hash of the posenc sources it runs (``files``, relative to the package)."""

    module: str
    posenc_sha256: str
    files: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """One graph pass of a ``posenc optimize`` run: its name, how many matches it rewrote, why it did not run, and
    why it left matches decomposed (``declined``: one reason per construct the target's fused op cannot express)."""

    name: str
    count: int
    skipped: str = field(optional=True, default="")
    declined: tuple[str, ...] = field(optional=True, default=())


@dataclasses.dataclass(frozen=True)
class OutputDrift:
    """How far one output moved under optimization (ONNX Runtime CPU, before vs after) and its tolerance."""

    max_abs_diff: float
    atol: float
    rtol: float


@dataclasses.dataclass(frozen=True)
class OptimizedRecord:
    """What ``posenc optimize`` did to a graph (the manifest's ``optimized`` record).

    Attributes:
        target: ``ort-cpu``, ``ort-cuda`` or ``trt``.
        rope: ``fused``, ``plugin`` or ``keep``.
        passes: every pass in order with its match count.
        parity: ``{output: OutputDrift}`` of the check before/after, or ``None`` when not run.
        source_onnx: file name of the graph it was optimized from.
        source_sha256: hex sha256 of that file.
        previous: the source's own record when an optimized graph was optimized again.
        shape_rules: names of the rules a fused kernel of this run imposes on a call's sizes beyond the dynamic
            dims (:mod:`posenc.export.shape_rules`, e.g. ``chunk-over-cache-one-row``); empty: any shape within them.
    """

    target: str
    rope: str
    passes: tuple[PassRecord, ...]
    parity: dict[str, OutputDrift] | None
    source_onnx: str
    source_sha256: str | None
    previous: OptimizedRecord | None = field(optional=True, default=None)
    shape_rules: tuple[str, ...] = field(optional=True, default=())

    @property
    def counts(self) -> dict[str, int]:
        """Pass name -> matches rewritten."""
        return {p.name: p.count for p in self.passes}


@dataclasses.dataclass(frozen=True)
class Manifest(Document):
    """What an exported ONNX file is (see the module docstring for the JSON layout)."""

    FORMAT: ClassVar[str] = MANIFEST_FORMAT
    REMEDY: ClassVar[str] = REEXPORT

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
    weights: WeightsRecord
    source: SourceRecord
    versions: dict[str, str]
    created: str
    notes: tuple[str, ...] = ()
    format: str = MANIFEST_FORMAT
    position_guard: bool = field(optional=True, default=False)
    """The graph guards its positions (an export option, on by default; manifests written before it: off)."""
    optimized: OptimizedRecord | None = field(optional=True, default=None)
    """Added by ``posenc optimize`` (:mod:`posenc.graphs`); absent in an export's manifest."""
    trace: TraceRecord | None = field(optional=True, default=None)
    """A traced export's layer and the fate of its positional parts (:mod:`posenc.export.trace`); else absent."""
    cache_ring: bool = field(optional=True, default=False)
    """A ``block-inplace`` graph whose caches are a sliding window's ring buffer (:mod:`posenc.export.units`:
    token ``t`` at slot ``t mod C``); manifests written before it: off."""

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

    def attention_config(self):
        """The geometry the module was built with: a :class:`posenc.config.AttentionConfig`, or a
        :class:`posenc.blocks.mla.MLAConfig` for an MLA block (its dict says ``"block": "mla"``)."""
        from posenc.blocks import attention_config_from_dict

        return attention_config_from_dict(self.attention)

    def rotary_config(self):
        """The geometry the positional scheme rotates: :meth:`attention_config`, or for an MLA block the
        ``AttentionConfig`` of its rope slice (:meth:`posenc.blocks.mla.MLAConfig.rope_config`)."""
        from posenc.blocks import rotary_geometry

        return rotary_geometry(self.attention_config())

    # -- (de)serialization: posenc.records.Document (to_dict / from_dict) -------------------------

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the manifest JSON atomically."""
        return write_text_atomic(path, self.to_json())


def _resolve_paths(path: str | os.PathLike[str]) -> tuple[Path | None, Path]:
    """``(onnx_path or None, manifest_path)`` for a path to either file."""
    path = Path(path)
    if path.name.endswith(".manifest.json"):
        onnx_path = path.with_name(path.name.removesuffix(".manifest.json") + ".onnx")
        return (onnx_path if onnx_path.exists() else None), path
    return path, manifest_path_for(path)


def load_manifest(path: str | os.PathLike[str], *, verify: bool = True) -> Manifest:
    """Read the manifest of an exported model.

    An interrupted write in the model's folder is finished first, and the files are read under the folder's shared
    lock (:func:`posenc.artifacts.files.reading`).

    Args:
        path: the ONNX file (its ``.manifest.json`` beside it is read) or the manifest itself.
        verify: check that the ONNX file (when present) and the weights file hash to what the
            manifest recorded (the weights by the safe-path rule, :func:`weights_file`).

    Raises:
        ModelFileError: the model or manifest is missing, not a regular file, unreadable, or does not match its
            model or weights.
    """
    if not str(path).strip():
        raise ModelFileError("the model path is empty; pass the path of an exported .onnx file.")
    with reading(path):  # no writer lands files in the folder while they are checked against each other
        onnx_path, manifest_path = _resolve_paths(path)
        if onnx_path is not None:
            input_file(onnx_path, "model")
        if not manifest_path.exists():
            raise ModelFileError(
                f"no manifest {manifest_path.name} beside {onnx_path or manifest_path}; posenc writes one on export. "
                f"Re-export with `posenc export ... -o {onnx_path or 'model.onnx'}` (a manifest cannot be guessed)."
            )
        manifest = Manifest.from_dict(read_manifest_json(manifest_path), f"manifest {manifest_path}")
        if verify:
            verify_files(manifest, onnx_path, manifest_path)
    return manifest


def read_manifest_json(manifest_path: Path) -> dict[str, Any]:
    """The JSON object stored in ``manifest_path`` (any format: export, graphs or engine manifests).

    Raises:
        ModelFileError: the file is not a regular file, unreadable, not JSON, or not a JSON object.
    """
    input_file(manifest_path, "manifest")
    try:
        data = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{manifest_path} is not readable JSON ({exc}); {REEXPORT}.") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{manifest_path} does not hold a JSON object; {REEXPORT}.")
    return data


def verify_files(manifest: Manifest, onnx_path: Path | None, manifest_path: Path) -> None:
    """Check the hashes of the ONNX file and the weights file (by the safe-path rule) against the manifest."""
    if onnx_path is not None:
        actual = sha256_file(input_file(onnx_path, "model"))
        if actual != manifest.onnx_sha256:
            raise ModelFileError(
                f"{onnx_path} does not match its manifest {manifest_path.name} (sha256 {actual[:12]}... != "
                f"{manifest.onnx_sha256[:12]}...): the file was modified, truncated or replaced. Re-export it "
                f"(`posenc export ...`), or restore the file the manifest describes."
            )
    weights_file(manifest, manifest_path)
    shared = manifest.weights.tables_file
    if shared is not None:
        member(manifest_path.parent, shared.path, f"tables file named by {manifest_path.name}", sha256=shared.sha256)


def weights_file(manifest: Manifest, manifest_path: str | os.PathLike[str], *, verify: bool = True) -> Path:
    """The weights file a manifest names, by the safe-path rule (:func:`posenc.artifacts.paths.member`): inside the
    manifest's folder, a regular file reached without a symlink out, and (``verify``) hashing to the recorded
    sha256, checked before anyone reads or copies it.

    Raises:
        ModelFileError: the name leads out of the folder, the file is missing or not regular, or its bytes changed.
    """
    manifest_path = Path(manifest_path)
    return member(
        manifest_path.parent,
        manifest.weights.path,
        f"weights file named by {manifest_path.name}",
        sha256=manifest.weights.sha256 if verify else None,
    )
