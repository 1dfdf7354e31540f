"""The project's CPU benchmark targets, checked from the records of one run (so every ratio shares its noise).

1. The RoPE op on ONNX Runtime CPU (fused graph) at B=1, S=2048, H=32, D=128 fp32, on the projection
   layout ``[B, S, H*D]`` (unit ``op-3d``), moves its bytes at >= 85 % of the copy bandwidth measured in
   the same run.
2. The same fused op is >= 5x faster than the decomposed export.
3. Each scheme's exported attention block on ONNX Runtime CPU (the faster of the exported and the optimized
   graph) is no slower than eager PyTorch at B=1, S=512.
4. There, every scheme whose attention the fused ops express (the optimized graph has a fused ``Attention``)
   computes its FLOPs at >= 90 % of the rate of an ONNX Runtime GEMM of the same FLOPs timed in the same rounds.
5. One decode step of the Llama-like RoPE block at past 4095 with the in-place cache, on its ``ort-cpu`` graph,
   moves its bytes floor (weights + cache read + new entries written) at >= 70 % of the copy bandwidth timed in the
   same rounds, and is >= 2.5x faster than the optimized concatenated-cache graph timed in the same rounds.
6. Every scheme's decode step there: the in-place cache is no slower than the concatenated one (the faster of
   the exported and the optimized graph of each).
7. With ``--guard-cost``: the position guard costs at most 2 % of a block's latency at prefill and decode (each
   graph timed with and without it in the same rounds; checked as unguarded ÷ guarded latency >= 0.98).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc.bench.plan import BLOCK_TARGET_SHAPE, DECODE_TARGET_SHAPE, ROPE_TARGET_CONFIG, ROPE_TARGET_SHAPE
from posenc.bench.results import BenchDocument, BenchRecord, TargetCheck

ROPE_BANDWIDTH_TARGET = 0.85
ROPE_SPEEDUP_TARGET = 5.0
BLOCK_SPEED_TARGET = 1.0
PREFILL_GEMM_TARGET = 0.90
DECODE_FLOOR_TARGET = 0.70
DECODE_SPEEDUP_TARGET = 2.5
DECODE_NO_SLOWER_TARGET = 1.0
GUARD_COST_TARGET = 0.98
"""Unguarded ÷ guarded latency: the guard may add at most 2 %."""


def _find(doc: BenchDocument, **where: Any) -> BenchRecord | None:
    shape = where.pop("shape")
    heads = where.pop("heads", None)
    for record in doc.records:
        if record.status != "ok" or record.shape != shape:
            continue
        if heads is not None and (record.config.num_heads, record.config.head_dim) != heads:
            continue
        if all(getattr(record, key) == value for key, value in where.items()):
            return record
    return None


def _check(name: str, measured: float | None, threshold: float, detail: str) -> TargetCheck:
    passed = None if measured is None else measured >= threshold
    return TargetCheck(name, measured, threshold, passed, detail)


def _ms(record: BenchRecord | None, digits: int = 2) -> str:
    """A record's median latency as ``"1.23 ms"`` (``"n/a"`` when it has none)."""
    if record is None or record.median is None:
        return "n/a"
    return f"{record.median * 1e3:.{digits}f} ms"


def _ratio(numerator: BenchRecord | None, denominator: BenchRecord | None) -> float | None:
    """``numerator.median / denominator.median``, or None when either is missing."""
    if numerator is None or denominator is None or not numerator.median or not denominator.median:
        return None
    return numerator.median / denominator.median


def _flops_detail(record: BenchRecord) -> str:
    """``"<backend> 1.23 ms for 4.56 GFLOP: 789 GFLOP/s; GEMM 800 GFLOP/s"`` of a prefill record."""
    flops, median, gemm = record.flops or 0, record.median or float("inf"), record.gemm_flops_per_s or 0.0
    return (
        f"{record.backend} {_ms(record)} for {flops / 1e9:.2f} GFLOP: {flops / median / 1e9:.0f} GFLOP/s; "
        f"GEMM {gemm / 1e9:.0f} GFLOP/s"
    )


def _bandwidth_detail(record: BenchRecord, doc: BenchDocument) -> str:
    moved = record.bytes_per_s or 0.0
    if record.copy_bytes_per_s:
        copy = f"copy {record.copy_bytes_per_s / 1e9:.1f} GB/s timed alongside"
    elif doc.copy_bandwidth is not None:
        copy = f"copy {doc.copy_bandwidth.bytes_per_s / 1e9:.1f} GB/s (start of run)"
    else:
        copy = "no copy bandwidth"
    return f"median {_ms(record)}, {moved / 1e9:.1f} GB/s; {copy}"


def evaluate_targets(doc: BenchDocument) -> list[TargetCheck]:
    """Every target the document has the records for (targets without any record are left out). The targets are
    the project's, about its schemes: a user's artifact (``posenc bench MODEL.onnx``) is reported apart
    (:func:`posenc.bench.tables.artifact_rows`), never as a scheme's target."""
    schemes_only = [r for r in doc.records if r.artifact is None]
    if len(schemes_only) != len(doc.records):
        doc = dataclasses.replace(doc, records=schemes_only)
    checks: list[TargetCheck] = []
    heads = (ROPE_TARGET_CONFIG.num_heads, ROPE_TARGET_CONFIG.head_dim)
    common = {"scheme": "rope", "unit": "op-3d", "shape": ROPE_TARGET_SHAPE, "heads": heads}
    fused = _find(doc, backend="ort-cpu-fused", **common)
    decomposed = _find(doc, backend="ort-cpu", **common)
    label = "RoPE op [B,S,H·D], ORT CPU, B=1 S=2048 H=32 D=128 fp32"
    if fused is not None or decomposed is not None:
        ratio = None if fused is None else fused.roofline_ratio
        checks.append(
            _check(
                f"{label}: fused op bytes/s ÷ copy bandwidth",
                ratio,
                ROPE_BANDWIDTH_TARGET,
                "no fused graph was timed" if fused is None else _bandwidth_detail(fused, doc),
            )
        )
        speedup = _ratio(decomposed, fused)
        checks.append(
            _check(
                f"{label}: decomposed latency ÷ fused latency",
                speedup,
                ROPE_SPEEDUP_TARGET,
                "needs both graphs timed" if speedup is None else f"decomposed {_ms(decomposed)}, fused {_ms(fused)}",
            )
        )
    schemes = dict.fromkeys(
        r.scheme for r in doc.records if r.unit == "block" and r.shape == BLOCK_TARGET_SHAPE and r.backend == "torch"
    )
    for scheme in schemes:
        eager = _find(doc, scheme=scheme, unit="block", backend="torch", shape=BLOCK_TARGET_SHAPE)
        ort = _fastest(doc, scheme, "block", BLOCK_TARGET_SHAPE)  # the deployable graph, named in the detail
        ratio = _ratio(eager, ort)
        detail = (
            "needs eager and ORT CPU timings"
            if ratio is None or ort is None
            else f"eager {_ms(eager)}, {ort.backend} {_ms(ort)}"
        )
        checks.append(_check(f"{scheme} block, B=1 S=512: eager latency ÷ ORT CPU latency", ratio, 1.0, detail))
    checks += _prefill_checks(doc, schemes)
    checks += _decode_checks(doc)
    checks += _guard_checks(doc)
    return checks


def _guard_checks(doc: BenchDocument) -> list[TargetCheck]:
    """Target 7: every block graph timed with and without the position guard."""
    checks = []
    for r in doc.ok():
        if not r.unit.startswith("block") or r.unguarded is None or not r.median:
            continue
        detail = f"guarded {_ms(r, 3)}, unguarded {r.unguarded.median * 1e3:.3f} ms"
        name = f"{r.scheme} {r.unit} {r.shape.label}, {r.backend}: unguarded latency ÷ guarded latency"
        checks.append(_check(name, r.unguarded.median / r.median, GUARD_COST_TARGET, detail))
    return checks


def _fastest(doc: BenchDocument, scheme: str, unit: str, shape: Any) -> BenchRecord | None:
    """The faster of the exported and the optimized ORT CPU graph of a case."""
    found = [_find(doc, scheme=scheme, unit=unit, backend=name, shape=shape) for name in ("ort-cpu", "ort-cpu-fused")]
    return min((r for r in found if r is not None), key=lambda r: r.median or float("inf"), default=None)


def _attention_fused(record: BenchRecord | None) -> bool:
    return record is not None and record.graph is not None and record.graph.counts.get("fuse_attention", 0) > 0


def _prefill_checks(doc: BenchDocument, schemes: Any) -> list[TargetCheck]:
    """Target 4: prefill FLOPs/s against a GEMM of the same FLOPs, for schemes with a fused Attention."""
    checks = []
    for scheme in schemes:
        fused = _find(doc, scheme=scheme, unit="block", backend="ort-cpu-fused", shape=BLOCK_TARGET_SHAPE)
        if not _attention_fused(fused):
            continue  # the fused ops do not express this scheme's attention
        best = max(
            (r for r in (fused, _find(doc, scheme=scheme, unit="block", backend="ort-cpu", shape=BLOCK_TARGET_SHAPE))
             if r is not None and r.flops_ratio is not None),
            key=lambda r: r.flops_ratio or 0.0,
            default=None,
        )  # fmt: skip
        detail = "no GEMM was timed alongside" if best is None else _flops_detail(best)
        name = f"{scheme} block prefill, B=1 S=512, ORT CPU: FLOP/s ÷ GEMM of the same FLOPs"
        checks.append(_check(name, None if best is None else best.flops_ratio, PREFILL_GEMM_TARGET, detail))
    return checks


def _decode_checks(doc: BenchDocument) -> list[TargetCheck]:
    """Targets 5 and 6: the decode step at past 4095."""
    checks: list[TargetCheck] = []
    shape = DECODE_TARGET_SHAPE
    label = f"decode B=1 P={shape.past}"
    inplace = _find(doc, scheme="rope", unit="block-inplace", backend="ort-cpu-fused", shape=shape)
    concat = _find(doc, scheme="rope", unit="block", backend="ort-cpu-fused", shape=shape)
    if inplace is not None or concat is not None:
        floor = None if inplace is None else inplace.roofline_ratio
        detail = "the in-place graph was not timed" if inplace is None else (
            f"in-place {_ms(inplace, 3)} for {(inplace.bytes_moved or 0) / 1e6:.1f} MB: "
            f"{_bandwidth_detail(inplace, doc)}"
        )  # fmt: skip
        checks.append(
            _check(f"rope block {label}, in-place cache, ORT CPU: bytes floor/s ÷ copy bandwidth", floor,
                   DECODE_FLOOR_TARGET, detail)
        )  # fmt: skip
        speedup = _ratio(concat, inplace)
        detail = "needs both graphs timed" if speedup is None else (
            f"concat (optimized) {_ms(concat, 3)}, in-place (optimized) {_ms(inplace, 3)}"
        )  # fmt: skip
        checks.append(
            _check(f"rope block {label}, ORT CPU: concat-cache latency ÷ in-place latency", speedup,
                   DECODE_SPEEDUP_TARGET, detail)
        )  # fmt: skip
    schemes = dict.fromkeys(r.scheme for r in doc.records if r.unit == "block-inplace" and r.shape == shape)
    for scheme in schemes:
        inplace, concat = _fastest(doc, scheme, "block-inplace", shape), _fastest(doc, scheme, "block", shape)
        ratio = _ratio(concat, inplace)
        detail = "needs both caches timed" if concat is None or inplace is None else (
            f"concat {_ms(concat, 3)} ({concat.backend}), in-place {_ms(inplace, 3)} ({inplace.backend})"
        )  # fmt: skip
        checks.append(
            _check(f"{scheme} block {label}: concat-cache latency ÷ in-place latency", ratio, DECODE_NO_SLOWER_TARGET,
                   detail)
        )  # fmt: skip
    return checks
