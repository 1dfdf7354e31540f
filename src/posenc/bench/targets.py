"""The project's CPU benchmark targets, checked from the records of one run (so every ratio shares its noise).

1. The RoPE op on ONNX Runtime CPU (fused graph) at B=1, S=2048, H=32, D=128 fp32, on the projection
   layout ``[B, S, H*D]`` (unit ``op-3d``), moves its bytes at >= 85 % of the copy bandwidth measured in
   the same run.
2. The same fused op is >= 5x faster than the decomposed export.
3. Each scheme's exported attention block on ONNX Runtime CPU (the faster of the exported and the optimized
   graph) is no slower than eager PyTorch at B=1, S=512.
"""

from __future__ import annotations

from typing import Any

from posenc.bench.plan import BLOCK_TARGET_SHAPE, ROPE_TARGET_CONFIG, ROPE_TARGET_SHAPE
from posenc.bench.results import BenchDocument, BenchRecord, TargetCheck

ROPE_BANDWIDTH_TARGET = 0.85
ROPE_SPEEDUP_TARGET = 5.0
BLOCK_SPEED_TARGET = 1.0


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


def _ms(record: BenchRecord | None) -> str:
    """A record's median latency as ``"1.23 ms"`` (``"n/a"`` when it has none)."""
    if record is None or record.median is None:
        return "n/a"
    return f"{record.median * 1e3:.2f} ms"


def _ratio(numerator: BenchRecord | None, denominator: BenchRecord | None) -> float | None:
    """``numerator.median / denominator.median``, or None when either is missing."""
    if numerator is None or denominator is None or not numerator.median or not denominator.median:
        return None
    return numerator.median / denominator.median


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
    """Every target the document has the records for (targets without any record are left out)."""
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
        graphs = [
            _find(doc, scheme=scheme, unit="block", backend=name, shape=BLOCK_TARGET_SHAPE)
            for name in ("ort-cpu", "ort-cpu-fused")
        ]
        # the deployable ORT CPU graph: the faster of the exported and the optimized one (named in the detail)
        ort = min((g for g in graphs if g is not None), key=lambda g: g.median or float("inf"), default=None)
        ratio = _ratio(eager, ort)
        detail = (
            "needs eager and ORT CPU timings"
            if ratio is None or ort is None
            else f"eager {_ms(eager)}, {ort.backend} {_ms(ort)}"
        )
        checks.append(_check(f"{scheme} block, B=1 S=512: eager latency ÷ ORT CPU latency", ratio, 1.0, detail))
    return checks
