"""What a benchmark run measures: a list of cases (scheme, unit, table mode, shape, geometry, backends).

Named suites: ``default`` (every scheme, op and block, prefill and decode, every backend) and ``targets``
(exactly the comparisons of the project's CPU targets; see :mod:`posenc.bench.targets`). A case may time further
units of its scheme in the same alternating rounds (:attr:`BenchCase.with_units`: a block's in-place cache beside
its concatenated one), so their ratio shares the machine's drift.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from posenc.bench.backends import get_backends
from posenc.bench.shapes import PRESETS, Shape, check_bench_shapes
from posenc.bench.workloads import ALL_UNITS, UNITS, check_unit
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.export.kinds import KV_CACHES, UnitKind
from posenc.schemes import get_spec, scheme_names
from posenc.schemes.base import TableMode

LLAMA_LIKE = AttentionConfig(
    hidden_size=1024, num_heads=8, num_kv_heads=2, head_dim=128, causal=True, max_position_embeddings=4096
)
"""The default block: Llama's head geometry (head_dim 128, 4 query heads per kv head), scaled down in width
so a CPU benchmarks every scheme in minutes."""

ROPE_TARGET_CONFIG = AttentionConfig(
    hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128, causal=True, max_position_embeddings=4096
)
"""Geometry of the RoPE-op target: H=32, D=128 (q and k both 32 heads)."""

ROPE_TARGET_SHAPE = Shape(batch=1, seq=2048, name="prefill")
BLOCK_TARGET_SHAPE = Shape(batch=1, seq=512, name="prefill")
DECODE_TARGET_SHAPE = Shape(batch=1, seq=1, past=LLAMA_LIKE.max_position_embeddings - 1, name="decode")
"""One decode step with the context full but one slot (past 4095 of 4096): the in-place cache's target shape."""
DECODE_BACKENDS: tuple[str, ...] = ("ort-cpu", "ort-cpu-fused")
TABLE_MODE_CHOICES = ("auto", "precomputed", "dynamic", "all")
SUITES = ("default", "targets")


@dataclasses.dataclass(frozen=True)
class BenchCase:
    """One workload to build, timed on each of ``backends``."""

    scheme: str
    unit: str
    table_mode: str
    shape: Shape
    config: AttentionConfig
    backends: tuple[str, ...]
    skip_reason: str = ""
    """Non-empty: the case is recorded as skipped for every backend (e.g. an unsupported table mode)."""
    with_units: tuple[str, ...] = ()
    """Further units of the scheme timed on the same backends in the same alternating rounds (records of their own)."""
    artifact: str | None = None
    """A user's ONNX file timed as it is (:mod:`posenc.bench.artifact`); ``None``: the scheme built here."""
    dtype: str | None = None
    """The artifact's activation dtype (``None`` for schemes, timed in float32)."""

    @property
    def label(self) -> str:
        units = "+".join((self.unit, *self.with_units))
        what = self.scheme if self.artifact is None else f"{Path(self.artifact).name} ({self.scheme})"
        return f"{what} {units} {self.table_mode} {self.shape.label}"


def table_modes_for(scheme: str, choice: str) -> list[tuple[str, str]]:
    """``(mode, skip_reason)`` pairs of ``scheme`` for a ``--table-mode`` choice.

    ``auto`` picks precomputed when the scheme has it, else dynamic; ``all`` every mode the scheme has;
    a named mode the scheme lacks comes back with a skip reason.
    """
    if choice not in TABLE_MODE_CHOICES:
        raise ConfigError(f"unknown table mode choice {choice!r}; use one of {list(TABLE_MODE_CHOICES)}.")
    modes = get_spec(scheme).table_modes
    supported = [m.value for m in TableMode if m in modes]  # precomputed first
    if choice == "auto":
        return [(supported[0], "")]
    if choice == "all":
        return [(m, "") for m in supported]
    if choice in supported:
        return [(choice, "")]
    return [(choice, f"{scheme} has no table mode {choice!r} (it has {supported})")]


def resolve_schemes(names: Sequence[str] | None) -> list[str]:
    """Scheme names to run (all registered when empty); unknown names raise with the valid list."""
    if not names:
        return scheme_names()
    for name in names:
        get_spec(name)
    return list(dict.fromkeys(names))


def make_plan(
    schemes: Sequence[str] | None = None,
    units: Sequence[str] | None = None,
    table_mode: str = "auto",
    shapes: Sequence[Shape] | None = None,
    backends: Sequence[str] | None = None,
    config: AttentionConfig = LLAMA_LIKE,
    kv_caches: Sequence[str] = ("concat",),
) -> list[BenchCase]:
    """The cross product of the choices, in an order that reuses each export across backends.

    ``kv_caches``: the block's cache layouts (``concat``, ``inplace``); a block with both is timed as one case (the
    in-place unit in :attr:`BenchCase.with_units`).

    Raises:
        ConfigError: unknown scheme, unit, cache layout, table mode choice or backend; an empty shape list.
    """
    names = resolve_schemes(schemes)
    unit_list = list(dict.fromkeys(units or UNITS))
    for unit in unit_list:
        if unit not in ALL_UNITS:
            raise ConfigError(f"unknown unit {unit!r}; use one of {list(UNITS)}.")
    layouts = list(dict.fromkeys(kv_caches or ("concat",)))
    for layout in layouts:
        if layout not in KV_CACHES:
            raise ConfigError(f"unknown kv cache layout {layout!r}; use one of {list(KV_CACHES)}.")
    explicit_units = bool(units)
    shape_list = check_bench_shapes(shapes) if shapes is not None else list(PRESETS.values())
    if not shape_list:
        raise ConfigError("no shapes to benchmark; give at least one --shape.")
    backend_names = tuple(b.name for b in get_backends(list(backends) if backends else None))
    cases = []
    for scheme in names:
        for unit in unit_list:
            unit_reason = check_unit(scheme, unit)
            if unit_reason and not explicit_units:
                continue  # by default a scheme gets the units it has; asked-for units show why not
            for mode, mode_reason in table_modes_for(scheme, table_mode):
                for shape in shape_list:
                    reason = unit_reason or mode_reason or ""
                    first, *rest = (
                        [UnitKind.parse(unit, layout).value for layout in layouts] if unit == "block" else [unit]
                    )
                    cases.append(BenchCase(scheme, first, mode, shape, config, backend_names, reason, tuple(rest)))
    return cases


def targets_plan(schemes: Sequence[str] | None = None, backends: Sequence[str] | None = None) -> list[BenchCase]:
    """The cases :func:`posenc.bench.targets.evaluate_targets` needs.

    1. RoPE op, B=1 S=2048 H=32 D=128 fp32, precomputed tables, on the projection layout ``[B, S, H*D]``
       (unit ``op-3d``, the target) and on ``[B, H, S, D]`` (unit ``op``, for comparison): eager, ORT CPU
       decomposed and fused.
    2. Every scheme's attention block (Llama-like geometry) at B=1 S=512: eager, ORT CPU decomposed and fused,
       with a GEMM of the same FLOPs timed alongside.
    3. Every scheme's decode step at past 4095 (:data:`DECODE_TARGET_SHAPE`): the concatenated and the in-place
       cache on ORT CPU (exported and optimized graphs) in the same rounds, with a copy timed alongside; RoPE's
       also on its ``ort-cuda`` graph run on CPU (``GroupQueryAttention``), for comparison.
    """
    chosen = tuple(backends) if backends else ("torch", "ort-cpu", "ort-cpu-fused")
    get_backends(list(chosen))
    cases = [
        BenchCase("rope", unit, "precomputed", ROPE_TARGET_SHAPE, ROPE_TARGET_CONFIG, chosen)
        for unit in ("op-3d", "op")
    ]
    decode = tuple(backends) if backends else DECODE_BACKENDS
    for scheme in resolve_schemes(schemes):
        for mode, reason in table_modes_for(scheme, "auto"):
            cases.append(BenchCase(scheme, "block", mode, BLOCK_TARGET_SHAPE, LLAMA_LIKE, chosen, reason))
            on = (*decode, "ort-cpu-gqa") if scheme == "rope" and not backends else decode
            inplace = ("block-inplace",)
            cases.append(BenchCase(scheme, "block", mode, DECODE_TARGET_SHAPE, LLAMA_LIKE, on, reason, inplace))
    return cases
