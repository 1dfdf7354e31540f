"""Benchmark of the fused RoPE kernel on a GPU against the bandwidth floor and the alternatives.

Measured per case: the kernel (best tactic and the launcher's default), a torch eager ``rotate_half``
baseline (Hugging Face's ``apply_rotary_pos_emb`` with precomputed ``[B, 1, S, D]`` cos/sin in the activation
dtype), and, when ``tensorrt`` is importable, TensorRT's native rotary layer and the posenc plugin inside an
engine. Device copy bandwidth (``dst.copy_(src)`` of 1 GiB, read + write counted) is measured in the same run;
each result is reported as achieved bytes/s and as a fraction of it.

It uses the benchmark package's pieces: shapes (:class:`~posenc.bench.shapes.Shape`) and geometry
(:class:`~posenc.config.AttentionConfig`), the timing loop (:func:`~posenc.bench.timing.measure`) with a
GPU clock, :class:`~posenc.bench.timing.Timing`, :class:`~posenc.bench.bandwidth.CopyBandwidth` and
:class:`~posenc.bench.results.TargetCheck`. What it adds is what a GPU kernel needs and ``posenc bench`` (whole
exported graphs per backend) does not: CUDA-event timing with an L2 flush before each launch, CUDA-graph replay
for launch-bound decode shapes, and contenders that are kernel launches rather than exported graphs.

Timing: prefill-sized cases time each launch with CUDA events and flush L2 (a 256 MiB write) before each one;
decode-sized cases (launch-bound, working set in L2 as after the QKV GEMM) replay a CUDA graph of 100 launches
and report time per launch. A CPU run (``device="cpu"``) uses Triton's interpreter and the wall clock to test the
harness; its numbers mean nothing.

Bytes counted (the roofline model of Williams, Waterman and Patterson, "Roofline: An Insightful Visual Performance
Model for Multicore Architectures", 2009, https://doi.org/10.1145/1498765.1498785): q and k read and written once,
``2 (Nq + Nk) e``; fp32 cos/sin rows ``2 U (r/2) 4`` with U distinct positions (B*S); int64 positions ``8 B S``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from posenc.bench import rope_contenders as contenders
from posenc.bench.bandwidth import CopyBandwidth
from posenc.bench.results import TargetCheck
from posenc.bench.shapes import Shape
from posenc.bench.timing import Timer, Timing, TimingSettings, measure, time_samples, wall_time
from posenc.config import AttentionConfig
from posenc.dtypes import torch_dtype
from posenc.plugins.rope.spec import TACTICS

__all__ = [
    "DECODE",
    "PREFILL",
    "SMOKE_CASES",
    "Contender",
    "KernelBenchDocument",
    "KernelCase",
    "KernelCaseResult",
    "bytes_moved",
    "format_table",
    "run_benchmark",
]

GRAPH_LAUNCHES = 100
"""Launches captured in one CUDA graph (decode timing reports time per launch)."""


@dataclasses.dataclass(frozen=True)
class KernelCase:
    """One benchmark case: a shape (past 0) and geometry, in one activation dtype.

    Attributes:
        shape: batch and new tokens.
        config: heads, kv heads, head dim; ``max_position_embeddings`` rows of the cos/sin table.
        dtype: activation dtype of q and k.
        graph_timing: time a CUDA graph of launches (decode) instead of single launches with an L2 flush (prefill).
    """

    shape: Shape
    config: AttentionConfig
    dtype: str = "bfloat16"
    graph_timing: bool = False


def _llama3_8b(positions: int = 8192) -> AttentionConfig:
    return AttentionConfig(
        hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=positions
    )


PREFILL = KernelCase(Shape(1, 4096, name="llama3-8b-prefill"), _llama3_8b())
DECODE = KernelCase(Shape(64, 1, name="llama3-8b-decode"), _llama3_8b(), graph_timing=True)
_TINY = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64)
SMOKE_CASES = (
    KernelCase(Shape(1, 8, name="smoke-prefill"), _TINY),
    KernelCase(Shape(4, 1, name="smoke-decode"), _TINY, graph_timing=True),
)
"""Tiny cases for a CPU run under Triton's interpreter (``scripts/bench_rope_gpu.py --smoke``)."""


@dataclasses.dataclass(frozen=True)
class Contender:
    """One contender timed on one case, or why it was skipped.

    Attributes:
        name: what was timed (``posenc kernel tactic ...``, ``torch eager rotate_half``, ...).
        timing: statistics of the timed launches (seconds per launch), when it ran.
        method: how it was timed.
        bytes_per_s: bytes moved / median.
        fraction_of_copy_bw: ``bytes_per_s`` / the run's copy bandwidth.
        skipped: why it did not run (an optional contender: tensorrt missing, build failed).
        block_h, num_warps: the kernel tactic.
    """

    name: str
    timing: Timing | None = None
    method: str = ""
    bytes_per_s: float | None = None
    fraction_of_copy_bw: float | None = None
    skipped: str = ""
    block_h: int | None = None
    num_warps: int | None = None

    @property
    def us(self) -> float | None:
        """Median microseconds per launch."""
        return None if self.timing is None else self.timing.median * 1e6


@dataclasses.dataclass(frozen=True)
class KernelCaseResult:
    """Every contender on one case, and the bytes one launch moves."""

    case: KernelCase
    bytes: int
    contenders: tuple[Contender, ...]

    def best_kernel(self) -> Contender | None:
        timed = [c for c in self.contenders if c.name.startswith("posenc kernel") and c.timing is not None]
        return min(timed, key=lambda c: c.timing.median) if timed else None  # type: ignore[union-attr]  # timed holds timed contenders only


@dataclasses.dataclass(frozen=True)
class KernelBenchDocument:
    """One run: device, copy bandwidth, every case's contenders, targets (JSON: :func:`posenc.records.to_json`)."""

    device: str
    copy_bandwidth: CopyBandwidth
    results: tuple[KernelCaseResult, ...]
    targets: tuple[TargetCheck, ...]


def bytes_moved(case: KernelCase, rotary_dim: int | None = None) -> int:
    """Minimum DRAM traffic of one rotation of q and k (see the module docstring)."""
    e = torch.finfo(torch_dtype(case.dtype)).bits // 8
    tokens = case.shape.batch * case.shape.seq
    c = case.config
    r = rotary_dim or c.head_dim
    qk = 2 * tokens * (c.num_heads + c.num_kv_heads) * c.head_dim * e
    return qk + 2 * tokens * (r // 2) * 4 + 8 * tokens


# --------------------------------------------------------------------------------------------------
# GPU clocks for posenc.bench.timing.measure
# --------------------------------------------------------------------------------------------------


def cuda_event_timer(flush: torch.Tensor | None = None) -> Timer:
    """Seconds of one launch between two CUDA events, after writing ``flush`` (an L2-sized buffer) if given."""

    def time_call(call: Callable[[], Any]) -> float:
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return time_call


def cuda_graph_of(call: Callable[[], Any], launches: int = GRAPH_LAUNCHES) -> Callable[[], Any]:
    """A replay of a CUDA graph that captured ``launches`` calls (the first call, compilation, runs outside)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # warm-up (compilation, autotune) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            call()
    return graph.replay


def _measure(call: Callable[[], Any], case: KernelCase, device: str, iters: int, flush: Any) -> tuple[Timing, str]:
    """Median of ``iters`` timed launches (one warm-up) with the clock the case needs, and how it was timed."""
    settings = TimingSettings(warmup=1, repeats=iters, min_repeats=iters, max_seconds=None, rounds=1)
    if device == "cpu":
        return measure(call, settings, wall_time), "perf_counter (CPU interpreter smoke run)"
    if case.graph_timing:
        timing = measure(cuda_graph_of(call), settings, cuda_event_timer())
        return timing.per_call(GRAPH_LAUNCHES), f"CUDA graph of {GRAPH_LAUNCHES} launches, time per launch"
    return measure(call, settings, cuda_event_timer(flush)), "CUDA events per launch, L2 flushed before each"


def copy_bandwidth(device: str, nbytes: int = 1 << 30, iters: int = 10) -> CopyBandwidth:
    """Device copy bandwidth (read + write counted), median of ``iters`` copies of ``nbytes``."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    timer = wall_time if device == "cpu" else cuda_event_timer()
    settings = TimingSettings(warmup=1, repeats=iters, min_repeats=iters, max_seconds=None, rounds=1)
    rates = tuple(2 * nbytes / s for s in time_samples(lambda: dst.copy_(src), settings, timer))
    return CopyBandwidth(statistics.median(rates), nbytes >> 20, iters, rates)


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------


def _timed(name: str, timed: tuple[Timing, str], nbytes: int, copy: CopyBandwidth, **tactic: int | None) -> Contender:
    timing, method = timed
    rate = nbytes / timing.median
    return Contender(name, timing, method, rate, rate / copy.bytes_per_s, **tactic)  # type: ignore[arg-type]  # tactic: the kernel knobs by name


SAME_BYTES_COPY = "copy of the same bytes (floor)"
"""The contender that is the case's own floor: one copy moving q's and k's bytes, timed like the kernel."""


def warm_up(device: str, seconds: float = 0.3) -> None:
    """Keep the GPU busy for ``seconds`` so its clocks leave idle before the first timed contender."""
    if device == "cpu":
        return
    src = torch.empty(64 << 20, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        for _ in range(20):
            dst.copy_(src)
        torch.cuda.synchronize()


def bench_case(
    case: KernelCase, device: str, copy: CopyBandwidth, iters: int, tactics: bool = True
) -> KernelCaseResult:
    """All contenders on one case; failures of optional contenders are recorded, not raised.

    The kernel's bytes are divided by each contender's time, so the ``same bytes`` copy's fraction is the floor
    this size allows (launch latency and L2 included), beside the large copy's bandwidth.
    """
    t = contenders.inputs(case, device)
    nbytes = bytes_moved(case)
    flush = torch.empty(64 << 20, dtype=torch.float32, device=device) if device != "cpu" else None
    warm_up(device)
    floor = _measure(contenders.same_bytes_copy_call(t), case, device, iters, flush)
    default = _measure(contenders.kernel_call(t, case, None, None), case, device, iters, flush)
    rows = [_timed(SAME_BYTES_COPY, floor, nbytes, copy)]
    rows.append(_timed("posenc kernel (default block)", default, nbytes, copy))
    if tactics and device != "cpu":
        for tactic, (block_h, warps) in TACTICS.items():
            timed = _measure(contenders.kernel_call(t, case, block_h, warps), case, device, iters, flush)
            rows.append(_timed(f"posenc kernel tactic {tactic}", timed, nbytes, copy, block_h=block_h, num_warps=warps))
    eager = _measure(contenders.eager_call(t), case, device, iters, flush)
    rows.append(_timed("torch eager rotate_half", eager, nbytes, copy))
    if device != "cpu":
        for name, native in (("TensorRT native rotary layer", True), ("TensorRT + posenc plugin (AOT)", False)):
            try:
                timed = _measure(contenders.trt_engine_call(t, case, native), case, device, iters, flush)
                rows.append(_timed(name, timed, nbytes, copy))
            except Exception as exc:  # tensorrt missing, too old, or the build failed: report it
                rows.append(Contender(name, skipped=f"{type(exc).__name__}: {exc}"))
    return KernelCaseResult(case, nbytes, tuple(rows))


def run_benchmark(
    cases: list[KernelCase] | None = None, *, device: str = "cuda", iters: int = 50, tactics: bool = True
) -> KernelBenchDocument:
    """Run every case; returns the document with copy bandwidth, contenders and target checks."""
    cases = cases or [PREFILL, DECODE]
    copy = copy_bandwidth(device, nbytes=(1 << 30) if device != "cpu" else (1 << 24))
    results = tuple(bench_case(c, device, copy, iters, tactics) for c in cases)
    return KernelBenchDocument(_device_name(device), copy, results, tuple(_targets(results)))


def _device_name(device: str) -> str:
    if device == "cpu":
        return "cpu (Triton interpreter smoke run)"
    return torch.cuda.get_device_name()


DECODE_TARGET_US = 5.0
PREFILL_TARGET_FRACTION = 0.9


def _targets(results: tuple[KernelCaseResult, ...]) -> list[TargetCheck]:
    checks = []
    for result in results:
        best = result.best_kernel()
        if best is None or best.us is None:
            continue
        name = result.case.shape.name
        native = next((c for c in result.contenders if c.name.startswith("TensorRT native") and c.us), None)
        if result.case.graph_timing:
            checks.append(
                TargetCheck(
                    f"{name}: decode launch ≤ {DECODE_TARGET_US:g} µs",
                    best.us,
                    DECODE_TARGET_US,
                    best.us <= DECODE_TARGET_US,
                    f"{best.name}: {best.us:.2f} µs per launch",
                )
            )
        else:
            fraction = best.fraction_of_copy_bw or 0.0
            floor = next((c for c in result.contenders if c.name == SAME_BYTES_COPY and c.us), None)
            if floor is not None and floor.us is not None:
                checks.append(
                    TargetCheck(
                        f"{name}: ≥ {PREFILL_TARGET_FRACTION:.0%} of a copy of the same bytes",
                        floor.us / best.us,
                        PREFILL_TARGET_FRACTION,
                        floor.us / best.us >= PREFILL_TARGET_FRACTION,
                        f"{best.name}: {best.us:.2f} µs, copy {floor.us:.2f} µs",
                    )
                )
            checks.append(
                TargetCheck(
                    f"{name}: ≥ {PREFILL_TARGET_FRACTION:.0%} of copy bandwidth",
                    fraction,
                    PREFILL_TARGET_FRACTION,
                    fraction >= PREFILL_TARGET_FRACTION,
                    f"{best.name}: {best.us:.2f} µs",
                )
            )
        if native is not None and native.us is not None:
            checks.append(
                TargetCheck(
                    f"{name}: not slower than TensorRT's rotary layer",
                    native.us / best.us,
                    1.0,
                    best.us <= native.us,
                    f"{best.name} {best.us:.2f} µs, native {native.us:.2f} µs",
                )
            )
    return checks


def format_table(doc: KernelBenchDocument) -> str:
    """A plain-text table of the document."""
    lines = [f"device: {doc.device}   copy bandwidth: {doc.copy_bandwidth.bytes_per_s / 1e9:.0f} GB/s"]
    for result in doc.results:
        lines.append(f"\n{result.case.shape.name}  ({result.bytes / 1e6:.2f} MB moved)")
        lines.append(f"  {'contender':<52} {'us':>10} {'GB/s':>9} {'% copy':>7}")
        for row in result.contenders:
            if row.us is not None and row.bytes_per_s is not None and row.fraction_of_copy_bw is not None:
                lines.append(
                    f"  {row.name:<52} {row.us:>10.2f} {row.bytes_per_s / 1e9:>9.0f} "
                    f"{100 * row.fraction_of_copy_bw:>6.1f}%"
                )
            else:
                lines.append(f"  {row.name:<52} skipped: {row.skipped[:80]}")
    lines.append("\ntargets:")
    for check in doc.targets:
        lines.append(f"  [{'met' if check.passed else 'MISSED'}] {check.name} ({check.detail})")
    return "\n".join(lines)
