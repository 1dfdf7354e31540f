"""Running exported models safely: feed checks against the manifest and ONNX Runtime sessions (the eager
rebuild, the reference: :mod:`posenc.export.eager`).

ONNX Runtime does not bound-check a Gather on a precomputed table: a position past the table either
crashes or silently reads garbage. :func:`check_feed` rejects such feeds first, with the remedy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from posenc.artifacts.paths import input_file, member
from posenc.dtypes import NUMPY_DTYPES
from posenc.errors import BackendUnavailable, ConfigError, ModelFileError, PositionError
from posenc.export.manifest import Manifest, load_manifest
from posenc.export.screen import screen_graph

# --------------------------------------------------------------------------------------------------
# Feed checks
# --------------------------------------------------------------------------------------------------


def _dims_of(manifest: Manifest, feed: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Sizes of the named dims as given by the feed; inconsistent sizes raise ConfigError."""
    sizes: dict[str, int] = {}
    for spec in manifest.inputs:
        array = feed[spec.name]
        if array.ndim != len(spec.shape):
            raise ConfigError(
                f"input {spec.name!r} must have rank {len(spec.shape)} {list(spec.shape)} ({spec.layout}), "
                f"got shape {list(array.shape)}."
            )
        for axis, (want, got) in enumerate(zip(spec.shape, array.shape, strict=True)):
            if isinstance(want, int):
                if want != got:
                    raise ConfigError(
                        f"input {spec.name!r} axis {axis} must be {want} ({spec.layout}), got {got} "
                        f"(shape {list(array.shape)})."
                    )
            elif sizes.setdefault(want, got) != got:
                raise ConfigError(
                    f"dim {want!r} is {sizes[want]} in one input but {got} in {spec.name!r}; "
                    f"all inputs must agree on {want}."
                )
    return sizes


def check_feed(manifest: Manifest, feed: Mapping[str, Any]) -> None:
    """Check a feed against the manifest before running the model.

    Checks names, ranks, fixed sizes, dtypes, dim consistency, dynamic dim minima, and that every
    position id (and, in a block, ``past + seq``) fits the precomputed table.

    Args:
        manifest: the model's manifest.
        feed: ``{input name: numpy array}``.

    Raises:
        ConfigError: missing/extra inputs, wrong rank, size or dtype.
        PositionError: negative positions, or positions at or past ``manifest.max_positions``.
    """
    missing = [n for n in manifest.input_names if n not in feed]
    extra = [n for n in feed if n not in manifest.input_names]
    if missing or extra:
        raise ConfigError(
            f"feed does not match the model's inputs {manifest.input_names}: missing {missing}, unexpected {extra}."
        )
    arrays = {name: np.asarray(value) for name, value in feed.items()}
    for spec in manifest.inputs:
        want = NUMPY_DTYPES.get(spec.dtype)
        if want is not None and arrays[spec.name].dtype != want:
            raise ConfigError(
                f"input {spec.name!r} must be {spec.dtype}, got {arrays[spec.name].dtype}; cast it "
                f"(position ids are int64; activations use the graph dtype {manifest.dtype})."
            )
    sizes = _dims_of(manifest, arrays)
    for name, size in sizes.items():
        bounds = manifest.dynamic_dims.get(name)
        if bounds is not None and size < bounds.min:
            raise ConfigError(f"dim {name!r} is {size}, below its minimum {bounds.min}.")
    limit = manifest.max_positions
    for spec in manifest.inputs:
        if spec.role != "positions" or arrays[spec.name].size == 0:
            continue
        positions = arrays[spec.name]
        low, high = int(positions.min()), int(positions.max())
        if low < 0:
            raise PositionError(f"input {spec.name!r} holds position {low}; position ids must be >= 0.")
        if limit is not None and high >= limit:
            raise PositionError(_past_table(manifest, f"input {spec.name!r} holds position {high}", high))
    _check_cache_lengths(manifest, arrays, sizes)
    if limit is not None and manifest.unit == "block":
        keys = sizes.get("past", 0) + sizes.get("seq", 0)
        if keys > limit:
            what = f"past + seq = {keys} keys need positions up to {keys - 1}"
            raise PositionError(_past_table(manifest, what, keys - 1))


def _check_cache_lengths(manifest: Manifest, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> None:
    """Filled slots of a preallocated cache (``block-inplace``): ``0 <= past_length`` and room for the new tokens."""
    caches = [spec for spec in manifest.inputs if spec.role == "cache"]
    for spec in manifest.inputs:
        if spec.role != "length" or not caches or arrays[spec.name].size == 0:
            continue
        lengths = arrays[spec.name]
        slots = int(arrays[caches[0].name].shape[2])
        seq = sizes.get("seq", 1)
        if int(lengths.min()) < 0:
            raise ConfigError(f"input {spec.name!r} holds {int(lengths.min())}; filled cache slots must be >= 0.")
        if int(lengths.max()) + seq > slots:
            raise ConfigError(
                f"input {spec.name!r} holds {int(lengths.max())} filled slots, so {seq} new tokens would end past the "
                f"cache's {slots} slots ({caches[0].name} {caches[0].layout}); start a new sequence, or export with "
                f"--max-positions {int(lengths.max()) + seq} or more for a longer cache."
            )


def _past_table(manifest: Manifest, what: str, position: int) -> str:
    from posenc.schemes import get_spec
    from posenc.schemes.base import TableMode

    if manifest.table_mode == TableMode.DYNAMIC.value:  # a limit of the scheme itself (xPos: its scales' range)
        limit = f"position {(manifest.max_positions or 0) - 1}, the last this {manifest.scheme} model serves"
        return f"{what}, past {limit}; see `posenc show {manifest.scheme}` for what bounds it."
    remedy = f"re-export with a longer table (`posenc export ... --max-positions {position + 1}` or more)"
    if TableMode.DYNAMIC in get_spec(manifest.scheme).table_modes:
        remedy += " or with `--table-mode dynamic` (tables computed in the graph, no length limit)"
    table = f"the precomputed table of {manifest.max_positions} rows of this {manifest.scheme} model"
    return f"{what}, past {table}; {remedy}."


# --------------------------------------------------------------------------------------------------
# ONNX Runtime
# --------------------------------------------------------------------------------------------------


def ort_providers(prefer_gpu: bool = True) -> list[str]:
    """``["CUDAExecutionProvider", "CPUExecutionProvider"]`` when CUDA is present, else CPU only."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendUnavailable("onnxruntime is not installed; `pip install onnxruntime`.") from None
    available = ort.get_available_providers()
    providers = ["CPUExecutionProvider"]
    if prefer_gpu and "CUDAExecutionProvider" in available:
        providers.insert(0, "CUDAExecutionProvider")
    return providers


def ort_session(
    model: str | os.PathLike[str] | bytes,
    providers: Sequence[str] | None = None,
    *,
    threads: int | None = None,
    spinning: bool = True,
    check: bool = True,
) -> Any:
    """An ``onnxruntime.InferenceSession``: the one place posenc creates them (validation, benchmarks, tests).

    Args:
        model: a path, or a serialized model (e.g. a graph just optimized, or emulated for bf16).
        providers: execution providers in order of preference (default :func:`ort_providers`).
        threads: intra-op threads, with one inter-op thread and sequential execution (benchmarks, so that
            every backend gets the same threads); ``None``: ONNX Runtime's defaults.
        spinning: ``False`` stops intra-op threads from spin-waiting after each run. Benchmarks alternate
            sessions on a few cores, where a session that just ran keeps spinning while the next one works
            (docs/performance.md, "Benchmark sessions"), so no benchmark session spins.
        check: run :func:`check_model_file` on a path first (truncated or invalid files get a clear error).

    Raises:
        ModelFileError: the file is missing, unreadable or not a model ONNX Runtime can load.
        BackendUnavailable: ONNX Runtime is missing, or lacks a kernel the graph needs.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendUnavailable("onnxruntime is not installed; `pip install onnxruntime`.") from None
    chosen = list(providers or ort_providers())
    what = "the serialized model" if isinstance(model, bytes) else str(model)
    if not isinstance(model, bytes):
        model = str(model)
        if check:
            check_model_file(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(model, options, providers=chosen)
    except Exception as exc:  # onnxruntime raises its own exception types
        text = str(exc)
        if "NOT_IMPLEMENTED" in text:
            raise BackendUnavailable(
                f"ONNX Runtime ({', '.join(chosen)}) has no kernel for part of {what}: {text.splitlines()[0][:300]}"
            ) from None
        raise ModelFileError(
            f"ONNX Runtime cannot load {what}: {text.splitlines()[0][:300]}. Re-export the model."
        ) from None


def check_model_file(path: str | os.PathLike[str]) -> Any:
    """Check that ``path`` is a readable, structurally valid ONNX model whose external data is safe to read.

    The file must be a regular, non-empty file; every tensor stored outside it (external data) must be named by
    the safe-path rule (:func:`posenc.artifacts.paths.member`: inside the model's folder, no symlink out, a regular
    file).
    Nothing outside the model's folder is opened.

    Returns:
        the ``onnx.ModelProto`` without its external data.

    Raises:
        ModelFileError: missing, not a regular file, empty, not ONNX, invalid, naming external data outside
            its folder, or beyond posenc's bounds (:func:`posenc.export.screen.screen_graph`: node count, loops).
    """
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    path = input_file(path, "ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelFileError(
            f"{path} is not a readable ONNX file ({type(exc).__name__}); it may be truncated or corrupt. "
            f"Re-export it with `posenc export ... -o {path}`."
        ) from None
    if not model.graph.node and not model.graph.output:
        raise ModelFileError(f"{path} holds no ONNX graph (no nodes, no outputs); re-export it.")
    screen_graph(model, str(path))  # node count and loop trip counts bounded before anything walks or runs it
    external = False
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            external = True
            location = ExternalDataInfo(tensor).location
            member(path.parent, location, f"external data of tensor {tensor.name!r} in {path.name}")
    try:
        # by path when tensors live in another file: the checker finds them beside the model, not in the cwd
        onnx.checker.check_model(str(path) if external else model)
    except Exception as exc:
        raise ModelFileError(
            f"{path} is not a valid ONNX model ({str(exc).splitlines()[0][:200]}); re-export it."
        ) from None
    return model


def run_onnx(
    path: str | os.PathLike[str],
    feed: Mapping[str, np.ndarray],
    *,
    manifest: Manifest | None = None,
    session: Any = None,
) -> dict[str, np.ndarray]:
    """Check ``feed`` against the manifest (:func:`check_feed`) and run the model with ONNX Runtime.

    Returns:
        ``{output name: array}``.

    Raises:
        ConfigError, PositionError: the feed does not fit the manifest (or the graph's guard refused a position).
        ModelFileError: ONNX Runtime failed to run the model.
    """
    manifest = manifest or load_manifest(path)
    check_feed(manifest, feed)
    session = session or ort_session(path)
    try:
        outputs = session.run(None, dict(feed))
    except Exception as exc:  # onnxruntime raises its own exception types
        text = " ".join(str(exc).split())
        if "out of data bounds" in text or "out of range" in text:
            raise PositionError(
                f"the graph's position guard refused a position of the feed ({text[-160:]}); position ids must be "
                f">= 0 and below the model's table ({manifest.max_positions} rows)."
            ) from None
        raise ModelFileError(f"ONNX Runtime could not run {path}: {text[:300]}") from None
    return {meta.name: value for meta, value in zip(session.get_outputs(), outputs, strict=True)}
