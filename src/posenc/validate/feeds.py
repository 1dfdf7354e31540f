"""Feeds for comparisons: which shapes, and the input arrays of each.

One shape type, :class:`posenc.export.Shape` ``(batch, seq, past)``, and one shrink rule for short
precomputed tables (:func:`fit_shapes`: ``seq`` first capped at the table, then ``past`` at what is left).
Feeds come from one of two builders, chosen by :func:`model_feeds`:

- with a manifest: :func:`posenc.export.make_feed` (realistic int64 position ids ``past + arange(seq)``,
  standard-normal activations in the graph dtype), checked against the manifest
  (:func:`posenc.export.check_feed`: a position past a precomputed table raises ``PositionError``);
- without one (an ONNX file from elsewhere): :func:`random_feed` from the graph's declared inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.artifacts.memory import human_bytes
from posenc.errors import ConfigError, ModelFileError
from posenc.export import shape_rules
from posenc.export.feeds import make_feed
from posenc.export.kinds import BLOCK_INPLACE
from posenc.export.manifest import Manifest
from posenc.export.runtime import check_feed
from posenc.export.screen import feed_bytes
from posenc.export.shapes import Shape

DEFAULT_SHAPES: tuple[Shape, ...] = (
    Shape(batch=1, seq=1, past=0),
    Shape(batch=3, seq=7, past=0),
    Shape(batch=2, seq=1, past=9),
    Shape(batch=2, seq=13, past=5),
)
"""Shapes other than the export sample (2, 4, 3): one token, odd prefill with batch 3, decode after 9
cached tokens, a prefill longer than the sample after 5 cached tokens."""

OPTIMIZE_CHECK_SHAPE = Shape(batch=2, seq=5, past=0)
MAX_FEED_BYTES = 1 << 28
"""Largest random feed (256 MiB) of one input of a graph without a manifest (declared static dimensions)."""
"""The feed of the before/after check of ``posenc optimize``: sizes unlike the export sample, so dynamic
dims are exercised."""


def fit_shapes(shapes: Sequence[Shape], max_positions: int | None) -> list[Shape]:
    """``shapes`` shrunk to fit a precomputed table of ``max_positions`` rows (``seq`` first, then ``past``).

    Duplicates that the shrinking creates are dropped; ``max_positions=None`` (no table limit) keeps all.
    """
    if max_positions is None:
        return list(shapes)
    fitted: list[Shape] = []
    for shape in shapes:
        seq = min(shape.seq, max_positions)
        candidate = Shape(shape.batch, seq, min(shape.past, max_positions - seq))
        if candidate not in fitted:
            fitted.append(candidate)
    return fitted


BOUNDARY_TOKENS = 4
"""New tokens of a feed around a boundary: two positions before it, two from it on."""


def serving_limit(manifest: Manifest, ring_positions: bool = False) -> int:
    """Positions (and, in place, cache slots) a graph serves: the least of its precomputed table, its in-place
    cache and its context length (``ring_positions``: a ring cache, the manifest's ``cache_ring``, does not bound
    the positions of a decode sequence, which wraps it)."""
    limits = [int(manifest.attention["max_position_embeddings"])]
    if manifest.max_positions is not None:
        limits.append(manifest.max_positions)
    if manifest.unit == BLOCK_INPLACE and not (ring_positions and manifest.cache_ring):
        limits.append(int(manifest.input("key_cache").shape[2]))
    return min(limits)


def scheme_boundaries(manifest: Manifest) -> list[int]:
    """Positions where the model's behaviour changes (``p``: between positions ``p - 1`` and ``p``), within what
    it serves: its rope type's own (:attr:`posenc.rope_types.RopeType.boundaries`: the pretraining context it
    extends, a switch length, llama3's band edges) and the last position it serves (the table's end)."""
    from posenc import rope_types
    from posenc.schemes.rope import rope_parameters

    limit = serving_limit(manifest)
    points = {limit}
    by_scheme = {rope_types.get(name).scheme: rope_types.get(name) for name in rope_types.names()}
    entry = by_scheme.get(manifest.scheme)
    if entry is not None and entry.boundaries is not None and entry.position_axes == 1:
        from posenc.schemes import get_spec

        resolved = get_spec(manifest.scheme).resolve(manifest.params)  # a traced manifest records only overrides
        params = rope_parameters(entry.name, resolved, manifest.rotary_config())
        points.update(entry.boundaries(params))
    return sorted(p for p in points if BOUNDARY_TOKENS <= p <= limit)


def boundary_shapes(manifest: Manifest) -> list[Shape]:
    """A window of :data:`BOUNDARY_TOKENS` new tokens across each :func:`scheme_boundaries` position (at the table
    end: its last positions), and for a causal block with a sliding window a decode step whose cache crosses the
    window's edge; for a layer masked by chunks a prompt across its chunks (:func:`chunk_span_of`). Multi-axis
    position ids (M-RoPE) get none (their feeds place images, not far positions)."""
    from posenc.schemes import get_spec

    try:
        if get_spec(manifest.scheme).position_axes != 1:
            return []
    except ConfigError:  # a manifest of a newer posenc: its default shapes only
        return []
    limit = serving_limit(manifest)
    shapes = []
    for point in scheme_boundaries(manifest):
        start = min(point - BOUNDARY_TOKENS // 2, limit - BOUNDARY_TOKENS)
        shapes.append(Shape(1, BOUNDARY_TOKENS, 0, start=start))
    window = manifest.attention.get("sliding_window")
    if window and manifest.unit.startswith("block") and window + 1 <= limit:
        shapes.append(Shape(1, 1, int(window)))  # keys 0 .. window: the oldest falls out of the window
    chunks = chunk_span_of(manifest)
    if chunks is not None and chunks <= limit:
        shapes.append(Shape(1, chunks, 0))  # keys of its own chunk, of the chunks before it, and beyond them
    return list(dict.fromkeys(shapes))


def chunk_span_of(manifest: Manifest) -> int | None:
    """For a traced layer masked by chunks of ``c`` positions that sees ``L`` chunks back
    (:mod:`posenc.trace.masks`), a prompt of ``(L + 2) · c + 1`` tokens: some query sees keys of its own chunk, of
    the chunks before it and has keys beyond them hidden; None otherwise."""
    mask = manifest.trace.mask if manifest.trace is not None else None
    if mask is None or mask.chunk is None:
        return None
    return ((mask.chunk_left if mask.chunk_left is not None else 0) + 2) * mask.chunk + 1


def default_shapes(manifest: Manifest | None) -> list[Shape]:
    """:data:`DEFAULT_SHAPES`, shrunk to fit the manifest's precomputed table, then the feeds that cross the
    model's boundaries (:func:`boundary_shapes`); each moved to the nearest shape the graph's fused kernels serve
    (:func:`posenc.export.shape_rules.fit_shapes`, e.g. one row for a chunk over an in-place GroupQueryAttention
    cache)."""
    if manifest is None:
        return list(DEFAULT_SHAPES)
    shapes = fit_shapes(DEFAULT_SHAPES, manifest.max_positions)
    return shape_rules.fit_shapes(manifest, shapes + [s for s in boundary_shapes(manifest) if s not in shapes])


def model_feeds(
    shapes: Sequence[Shape],
    *,
    manifest: Manifest | None = None,
    model: Any = None,
    seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """One feed per shape (activations seeded ``seed + index``).

    Args:
        shapes: the feed sizes.
        manifest: the model's manifest; its feeds are realistic and checked against it.
        model: the ``onnx.ModelProto``, for manifest-less models (random feeds of its declared inputs).
        seed: seed of the first feed.

    Returns:
        ``[{input name: array}]`` in the order of ``shapes``; arrays in the graph's dtypes (bf16 graphs
        get ``ml_dtypes.bfloat16`` arrays; :func:`posenc.validate.bf16.prepare_for_ort` converts them).

    Raises:
        PositionError: a shape reaches past the manifest's precomputed table.
        ConfigError: neither ``manifest`` nor ``model`` is given.
    """
    if manifest is not None:
        feeds = [make_feed(manifest, shape, seed=seed + i) for i, shape in enumerate(shapes)]
        for feed in feeds:
            check_feed(manifest, feed)
        return feeds
    if model is None:
        raise ConfigError("model_feeds needs a manifest (realistic feeds) or the ONNX model (random feeds).")
    return [random_feed(model, shape, seed=seed + i) for i, shape in enumerate(shapes)]


def random_feed(model: Any, shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for the declared inputs of an ``onnx.ModelProto`` (a model without a manifest).

    Symbolic dims get ``shape.seq`` (``shape.batch`` on the first axis). Integer inputs get ``arange`` rows
    (position-id-like), booleans ``True``, floats standard-normal values in the input's dtype.

    Raises:
        ModelFileError: an input has a type posenc cannot feed, or static dimensions whose feed would exceed
            :data:`MAX_FEED_BYTES`.
    """
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    feed: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (shape.batch if axis == 0 else shape.seq)
            for axis, d in enumerate(tensor.shape.dim)
        ]
        try:
            np_type = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        except (KeyError, ValueError, TypeError):
            np_type = None
        if np_type is None or (np_type.kind not in "iufb" and tensor.elem_type != TensorProto.BFLOAT16):
            name = TensorProto.DataType.Name(tensor.elem_type) if tensor.elem_type else "unknown"
            raise ModelFileError(f"input {value.name!r} has type {name}, which posenc cannot feed; pass a feed.")
        nbytes = feed_bytes(dims, np_type.itemsize)
        if nbytes > MAX_FEED_BYTES:
            raise ModelFileError(
                f"input {value.name!r} is declared {dims}: a feed of {human_bytes(nbytes)}, over posenc's "
                f"{human_bytes(MAX_FEED_BYTES)} bound for a graph without a manifest; declare its large dimensions "
                f"symbolic (posenc feeds them {shape.batch} and {shape.seq}) or pass a posenc export."
            )
        if np_type.kind in "iu":
            feed[value.name] = np.broadcast_to(np.arange(dims[-1] if dims else 1), dims).astype(np_type).copy()
        elif np_type.kind == "b":
            feed[value.name] = np.ones(dims, dtype=bool)
        else:
            feed[value.name] = rng.standard_normal(dims).astype(np.float32).astype(np_type)
    return feed
