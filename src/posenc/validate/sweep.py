"""Error against position: exported positional ops run by ONNX Runtime vs the float64 eager reference.

Running and the tolerance verdict go through :func:`posenc.validate.compare.compare`; the per-position
statistics below are computed here from the outputs it collected.

For each scheme (default: every scheme acting on q/k, scores or attention, i.e. the RoPE family and the
relative schemes), each table mode, each graph dtype and each table dtype, the scheme's op is exported
(``precomputed`` with ``max_position + 1`` rows), and positions sampled in buckets
(default ``[0, 1k)``, ``[1k, 8k)``, ``[8k, 32k)``, ``[32k, 131072]``) are fed:

- ``qk`` ops rotate q and k at the sampled positions (one column per position);
- ``score`` / ``attention`` ops take one query at position p and keys at ``p - offset`` for
  :data:`KEY_OFFSETS` (clipped at 0), one batch row per p.

Per position the report keeps the max absolute error, the max relative error (normwise: max abs
error / max |reference| of that position) and the max error in ULPs of the output dtype. A series
passes when every position is within the scheme tolerance and, for fp16 graphs with float32 tables,
within fp16 rounding of the reference (``|err| <= 1 ulp16(|ref|) + 4 eps32 max|ref|``: the output's own
rounding plus float32 arithmetic). Series with fp16 tables (``table_dtype=torch.float16``) show what
storing tables in fp16 would cost; they are informational (the report's verdict covers the float32-table
series).

Data structure (for plots): :class:`SweepReport` -> :class:`SweepSeries` (one line per
scheme/dtype/mode/table dtype) -> :class:`SweepPoint` (position, errors) and :class:`BucketStats`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from posenc.artifacts.files import scratch_folder, write_text_atomic
from posenc.artifacts.memory import check_bytes
from posenc.config import AttentionConfig
from posenc.dtypes import NUMPY_DTYPES, dtype_name
from posenc.errors import ConfigError
from posenc.export.eager import load_eager
from posenc.export.feeds import slots_from_manifest
from posenc.export.manifest import Manifest
from posenc.export.runtime import check_feed, ort_providers
from posenc.records import to_json
from posenc.schemes import get_spec, specs
from posenc.schemes.base import Placement, TableMode
from posenc.validate.bf16 import prepare_for_ort
from posenc.validate.compare import compare, eager_reference
from posenc.validate.runners import ort_runner
from posenc.validate.tolerance import tolerance_for

MAX_POSITION = 131072
DEFAULT_BUCKETS: tuple[tuple[int, int], ...] = ((0, 1024), (1024, 8192), (8192, 32768), (32768, MAX_POSITION + 1))
"""Half-open ``[lo, hi)`` position buckets; the last one includes 131072."""
KEY_OFFSETS: tuple[int, ...] = (0, 1, 2, 3, 5, 8, 13, 64, 512, 4096, 1 << 30)
"""Key positions ``p - offset`` (clipped at 0; the last one is the first token) for score/attention ops."""
SWEEP_CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=4096)
"""Small rotary dims (head_dim 16) keep 131073-row tables small; context 4096 puts LongRoPE's switch
(at 1024) and dynamic NTK's growth (past 4096) inside the sweep."""


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """Errors at one position (max over heads, dims, and q/k or keys of that position)."""

    position: int
    max_abs: float
    max_rel: float
    max_ulps: float


@dataclasses.dataclass(frozen=True)
class BucketStats:
    """Summary of the sampled positions in ``[lo, hi)``."""

    lo: int
    hi: int
    count: int
    max_abs: float
    max_rel: float
    max_ulps: float
    within_tolerance: bool
    within_rounding: bool

    @property
    def label(self) -> str:
        if (self.hi - 1) % 1024 == 0 and self.hi - 1 > 0:
            return f"[{_k(self.lo)}, {_k(self.hi - 1)}]"
        return f"[{_k(self.lo)}, {_k(self.hi)})"


def _k(value: int) -> str:
    return f"{value // 1024}k" if value >= 1024 and value % 1024 == 0 else str(value)


@dataclasses.dataclass
class SweepSeries:
    """One exported op swept over positions."""

    scheme: str
    case: str
    dtype: str
    table_mode: str
    table_dtype: str
    atol: float
    rtol: float
    points: list[SweepPoint]
    buckets: list[BucketStats]
    rounding_required: bool

    @property
    def key(self) -> str:
        return f"{self.scheme}/{self.dtype}/{self.table_mode}/tables-{self.table_dtype}"

    @property
    def required(self) -> bool:
        """Deployable configuration (float32 tables); fp16-table series only show what fp16 tables cost."""
        return self.table_dtype == "float32"

    @property
    def passed(self) -> bool:
        ok = all(b.within_tolerance for b in self.buckets)
        if self.rounding_required:
            ok = ok and all(b.within_rounding for b in self.buckets)
        return ok

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("required", "passed")


@dataclasses.dataclass
class SweepReport:
    """All series of a :func:`position_sweep`; JSON and Markdown output."""

    max_position: int
    buckets: tuple[tuple[int, int], ...]
    series: list[SweepSeries]

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("passed",)

    @property
    def passed(self) -> bool:
        """Every required (float32-table) series passes; fp16-table series are informational."""
        return all(s.passed for s in self.series if s.required)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (:func:`posenc.records.to_json`; the verdicts ``passed``/``required`` included)."""
        return to_json(self)

    def to_markdown(self) -> str:
        """Per scheme: one row per dtype / table mode / table dtype, max abs error (and ULPs) per bucket."""
        labels = [BucketStats(lo, hi, 0, 0, 0, 0, True, True).label for lo, hi in self.buckets]
        lines = [
            f"### Error against position (ONNX Runtime vs float64 eager), positions up to {self.max_position}",
            "",
            "Cells: max abs error (max error in ULPs of the output dtype). fp16 graphs with fp32 tables must stay",
            "within fp16 rounding (<= 1 ulp + fp32 arithmetic); fp16-table rows (informational) show what fp16",
            "tables would cost.",
            "",
        ]
        header = "| scheme | dtype | table mode | tables | " + " | ".join(labels) + " | result |"
        lines += [header, "|---|---|---|---|" + "---:|" * len(labels) + "---|"]
        for s in self.series:
            cells = [f"{b.max_abs:.2e} ({b.max_ulps:.1f})" for b in s.buckets]
            if s.required:
                verdict = "pass" if s.passed else "**FAIL**"
            else:
                tolerance = "within tolerance" if s.passed else "beyond tolerance"
                rounding = "within" if all(b.within_rounding for b in s.buckets) else "beyond"
                verdict = f"cost: {tolerance}, {rounding} fp16 rounding"
            head = f"| {s.scheme} | {s.dtype} | {s.table_mode} | {s.table_dtype} |"
            lines.append(f"{head} {' | '.join(cells)} | {verdict} |")
        return "\n".join(lines) + "\n"

    def save(
        self, json_path: str | os.PathLike[str] | None = None, markdown: str | os.PathLike[str] | None = None
    ) -> list[Path]:
        written = []
        if json_path is not None:
            written.append(write_text_atomic(json_path, json.dumps(self.to_dict(), indent=2) + "\n"))
        if markdown is not None:
            written.append(write_text_atomic(markdown, self.to_markdown()))
        return written


def sweep_schemes() -> list[str]:
    """Schemes a sweep covers by default: those acting on q/k, scores or attention that export an op."""
    placements = (Placement.QK, Placement.SCORE, Placement.ATTENTION)
    return [s.name for s in specs() if s.placement in placements and "op" in s.exports]


def sample_positions(buckets: Sequence[tuple[int, int]], per_bucket: int, seed: int = 0) -> list[np.ndarray]:
    """Per bucket: its first and last position plus ``per_bucket - 2`` seeded uniform ones (sorted, unique)."""
    if per_bucket < 1:
        raise ConfigError(f"per_bucket must be >= 1, got {per_bucket}.")
    rng = np.random.default_rng(seed)
    chosen = []
    for lo, hi in buckets:
        if hi <= lo:
            raise ConfigError(f"bucket [{lo}, {hi}) is empty; give increasing bounds.")
        picks = {lo, hi - 1} if per_bucket > 1 else {hi - 1}
        extra = max(per_bucket - len(picks), 0)
        picks |= {int(x) for x in rng.integers(lo, hi, size=extra)}
        chosen.append(np.array(sorted(picks), dtype=np.int64))
    return chosen


def _along_sequence(manifest: Manifest) -> bool:
    """The sampled positions run along the sequence axis (-2 of every output): rotary and embedding ops, and whole
    blocks (one sequence at the sampled positions, each token seeing those before it); else along the batch axis
    (score / attention ops: one query per row with its keys)."""
    return manifest.unit == "block" or manifest.placement in (Placement.QK.value, Placement.EMBEDDING.value)


def _sweep_feed(manifest: Manifest, positions: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    np_dtype = NUMPY_DTYPES[manifest.dtype]
    n = len(positions)
    if manifest.unit == "block":
        sizes = {"batch": 1, "seq": n, "past": 0}
        pos_q, pos_k = positions[None, :], None
    elif _along_sequence(manifest):
        sizes = {"batch": 1, "seq": n}
        pos_q, pos_k = positions[None, :], None
    else:
        keys = np.maximum(positions[:, None] - np.array(KEY_OFFSETS, dtype=np.int64)[None, :], 0)
        sizes = {"batch": n, "seq": 1, "kv_seq": keys.shape[1]}
        pos_q, pos_k = positions[:, None], keys
    feed = {}
    for slot in slots_from_manifest(manifest):
        if slot.kind == "pos_q":
            feed[slot.name] = np.ascontiguousarray(pos_q)
        elif slot.kind == "pos_k":
            feed[slot.name] = np.ascontiguousarray(pos_k)
        else:
            shape = tuple(d if isinstance(d, int) else sizes[d] for d in slot.shape)
            feed[slot.name] = rng.standard_normal(shape).astype(np.float32).astype(np_dtype)
    return feed


def _per_position(manifest: Manifest, outputs: list[np.ndarray], references: list[np.ndarray], n: int):
    """(max_abs, max_rel, max_ulps, within_rounding) per position, arrays of length n."""
    max_abs = np.zeros(n)
    scale = np.zeros(n)
    max_ulps = np.zeros(n)
    rounding_ok = np.ones(n, dtype=bool)
    qk = _along_sequence(manifest)
    for got, ref in zip(outputs, references, strict=True):
        got64 = got.astype(np.float64)
        # positions along axis -2 (seq) for qk ops, along the batch axis for score/attention ops
        moved_got = np.moveaxis(got64, -2 if qk else 0, 0).reshape(n, -1)
        moved_ref = np.moveaxis(ref, -2 if qk else 0, 0).reshape(n, -1)
        err = np.abs(moved_got - moved_ref)
        spacing = np.spacing(np.abs(moved_ref).astype(got.dtype)).astype(np.float64)
        row_scale = np.abs(moved_ref).max(axis=1)
        floor = 4 * np.finfo(np.float32).eps * row_scale[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            ulps = np.where(err > 0, err / spacing, 0.0)
        max_abs = np.maximum(max_abs, err.max(axis=1))
        scale = np.maximum(scale, row_scale)
        max_ulps = np.maximum(max_ulps, ulps.max(axis=1))
        rounding_ok &= (err <= spacing + floor).all(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        max_rel = np.where(scale > 0, max_abs / scale, np.where(max_abs > 0, np.inf, 0.0))
    return max_abs, max_rel, max_ulps, rounding_ok


def sweep_model(
    path: str | os.PathLike[str],
    positions_per_bucket: Sequence[np.ndarray],
    buckets: Sequence[tuple[int, int]],
    *,
    case: str = "default",
    seed: int = 0,
) -> SweepSeries:
    """Sweep one exported op or block (``posenc export``, ``--kv-cache concat``) over the given positions.

    One feed per bucket goes through :func:`posenc.validate.compare.compare` (the float64 eager reference
    against ONNX Runtime CPU); a bucket is within tolerance when all its rows pass, and the per-position
    statistics are computed from the outputs the comparison collected. A block's feed is one sequence of new tokens
    at the bucket's sampled positions (no cache), so each token attends to the sampled ones before it.

    Raises:
        ConfigError: an in-place cache or multi-axis graph (sweep its concatenated-cache, text export).
    """
    reference, manifest = load_eager(path)
    if manifest.unit not in ("block", "op"):
        raise ConfigError(
            f"sweep takes an op or a block with a concatenated cache, not unit {manifest.unit!r}; sweep the "
            f"`--kv-cache concat` export of the same layer (and `posenc validate --decode` this one)."
        )
    if manifest.unit == "block" and len(manifest.input("position_ids").shape) == 3:
        raise ConfigError("sweep feeds one position per token; multi-axis position ids (M-RoPE) are not swept.")
    # An op's outputs share one dtype (a score op's bias is in its tables' float32 even in fp16 graphs).
    tol = tolerance_for(manifest.scheme, manifest.outputs[0].dtype, manifest.outputs[0].name)
    feeds = [_sweep_feed(manifest, positions, seed + index) for index, positions in enumerate(positions_per_bucket)]
    for feed in feeds:
        check_feed(manifest, feed)
    prepared = prepare_for_ort(path, feeds)
    eager = eager_reference(reference, manifest, prepared.feeds[0])
    candidate = ort_runner(prepared.model, ort_providers())
    comparison = compare([eager], [candidate], prepared.feeds, dict.fromkeys(manifest.output_names, tol))
    points: list[SweepPoint] = []
    stats: list[BucketStats] = []
    for index, ((lo, hi), positions) in enumerate(zip(buckets, positions_per_bucket, strict=True)):
        got, expected = comparison.outputs(candidate.name, index), comparison.outputs(eager.name, index)
        outputs = [got[name] for name in manifest.output_names]
        refs = [expected[name] for name in manifest.output_names]
        max_abs, max_rel, max_ulps, rounding_ok = _per_position(manifest, outputs, refs, len(positions))
        points += [
            SweepPoint(int(p), float(a), float(r), float(u))
            for p, a, r, u in zip(positions, max_abs, max_rel, max_ulps, strict=True)
        ]
        stats.append(
            BucketStats(
                lo=lo,
                hi=hi,
                count=len(positions),
                max_abs=float(max_abs.max()),
                max_rel=float(max_rel.max()),
                max_ulps=float(max_ulps.max()),
                within_tolerance=all(row.passed for row in comparison.rows if row.feed == index),
                within_rounding=bool(rounding_ok.all()),
            )
        )
    return SweepSeries(
        scheme=manifest.scheme,
        case=case,
        dtype=manifest.dtype,
        table_mode=manifest.table_mode,
        table_dtype=manifest.table_dtype,
        atol=tol.atol,
        rtol=tol.rtol,
        points=points,
        buckets=stats,
        # fp16 rounding bounds one rotation or bias (an op); a block accumulates many
        rounding_required=manifest.unit == "op" and manifest.dtype == "float16" and manifest.table_dtype == "float32",
    )


def sweep_artifact(
    path: str | os.PathLike[str],
    *,
    max_position: int | None = None,
    per_bucket: int = 8,
    seed: int = 0,
) -> SweepReport:
    """Error against position of one exported file as it is (``posenc sweep MODEL.onnx``): its own scheme
    parameters, dtype, tables and weights, at positions sampled in :data:`DEFAULT_BUCKETS` up to the last position
    it serves (:func:`posenc.validate.feeds.serving_limit`, or ``max_position`` when smaller).

    Raises:
        ConfigError: a bf16 graph (ONNX Runtime CPU has no bf16 kernels), an in-place or multi-axis graph, or a
            ``max_position`` past what the graph serves.
    """
    from posenc.export.manifest import load_manifest
    from posenc.validate.feeds import serving_limit

    manifest = load_manifest(path)
    if manifest.dtype == "bfloat16":
        raise ConfigError("sweep runs on ONNX Runtime CPU, which has no bf16 kernels; sweep an fp32 or fp16 export.")
    last = serving_limit(manifest) - 1
    if max_position is not None:
        if max_position > last:
            raise ConfigError(
                f"--last-position {max_position} is past the last position {Path(path).name} serves ({last}); "
                f"give at most {last}."
            )
        last = max_position
    buckets = tuple((lo, min(hi, last + 1)) for lo, hi in DEFAULT_BUCKETS if lo <= last)
    positions = sample_positions(buckets, per_bucket, seed)
    series = sweep_model(path, positions, buckets, case=Path(path).name, seed=seed)
    return SweepReport(max_position=last, buckets=buckets, series=[series])


def position_sweep(
    schemes: Sequence[str] | None = None,
    *,
    dtypes: Sequence[str] = ("fp32", "fp16"),
    table_modes: Sequence[str] | None = None,
    fp16_tables: bool = True,
    max_position: int = MAX_POSITION,
    buckets: Sequence[tuple[int, int]] | None = None,
    per_bucket: int = 8,
    config: AttentionConfig | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> SweepReport:
    """Error against position for exported positional ops (see the module docstring).

    Args:
        schemes: scheme names (default :func:`sweep_schemes`).
        dtypes: graph dtypes (fp32, fp16).
        table_modes: modes to sweep (default: every mode each scheme supports).
        fp16_tables: add fp16-graph series with ``table_dtype=torch.float16`` (what fp16 tables cost).
        max_position: largest position; precomputed ops are exported with ``max_position + 1`` rows.
        buckets: ``[lo, hi)`` buckets (default :data:`DEFAULT_BUCKETS`, clipped to ``max_position``).
        per_bucket: sampled positions per bucket (including both ends).
        config: geometry (default :data:`SWEEP_CONFIG`).
        params: per-scheme parameter overrides.
        workdir: where the ONNX files go (default: a temporary directory, removed afterwards).
        seed: seed of positions and activations.

    Returns:
        :class:`SweepReport`.
    """
    from posenc.export.exporter import export_scheme

    names = list(schemes) if schemes is not None else sweep_schemes()
    config = config or SWEEP_CONFIG
    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 1:
        raise ConfigError(f"max_position (--last-position) must be an int >= 1, got {max_position!r}.")
    if isinstance(per_bucket, bool) or not isinstance(per_bucket, int) or per_bucket < 1:
        raise ConfigError(f"per_bucket must be an int >= 1, got {per_bucket!r}.")
    check_bytes(  # one feed per bucket: per_bucket positions, each with its keys
        per_bucket * (len(KEY_OFFSETS) + 1) * config.num_heads * config.head_dim * 8 * 8,
        f"sweep feeds of {per_bucket:,} positions per bucket",
        "give a smaller --per-bucket.",
    )
    if buckets is None:
        buckets = [(lo, min(hi, max_position + 1)) for lo, hi in DEFAULT_BUCKETS if lo <= max_position]
    buckets = tuple((int(lo), int(hi)) for lo, hi in buckets)
    if buckets[-1][1] > max_position + 1:
        raise ConfigError(f"the last bucket ends at {buckets[-1][1]}, past max_position + 1 = {max_position + 1}.")
    positions = sample_positions(buckets, per_bucket, seed)
    series: list[SweepSeries] = []
    with scratch_folder("sweep") as scratch:  # removed afterwards, or by the next run if this one is killed
        folder = Path(workdir) if workdir is not None else Path(scratch)
        for name in names:
            spec = get_spec(name)
            modes = [m.value for m in sorted(spec.table_modes, key=lambda m: m.value)]
            if table_modes is not None:
                modes = [m for m in modes if m in {TableMode.parse(t).value for t in table_modes}]
            for mode in modes:
                for dtype in (dtype_name(d) for d in dtypes):
                    table_dtypes = [torch.float32]
                    if fp16_tables and dtype == "float16":
                        table_dtypes.append(torch.float16)
                    for table_dtype in table_dtypes:
                        tag = f"{name}_{mode}_{dtype}_t{dtype_name(table_dtype)}"
                        result = export_scheme(
                            name,
                            folder / f"{tag}.onnx",
                            unit="op",
                            params=(params or {}).get(name),
                            config=config,
                            table_mode=mode,
                            dtype=dtype,
                            max_positions=max_position + 1,
                            table_dtype=table_dtype,
                        )
                        series.append(sweep_model(result.path, positions, buckets, seed=seed))
    return SweepReport(max_position=max_position, buckets=buckets, series=series)
