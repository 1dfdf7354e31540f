"""Latency benchmarks against the hardware limit (``posenc bench``).

Each scheme's positional op and attention block is timed on every backend present (eager PyTorch, ONNX
Runtime CPU on the exported and the fused graph, ONNX Runtime CUDA, TensorRT), at prefill and decode shapes,
and compared with the machine's copy bandwidth measured in the same run.

Example::

    from posenc.bench import RunSettings, make_plan, run_bench
    doc = run_bench(make_plan(["rope"], units=["op"]), RunSettings(threads=2), "bench-results")
    print(doc.records[0].timing.median, doc.records[0].roofline_ratio)
"""

from posenc.bench.backends import BACKEND_NAMES, Backend, get_backends
from posenc.bench.bandwidth import CopyBandwidth, measure_copy_bandwidth
from posenc.bench.harness import run_bench
from posenc.bench.models import SkipCase
from posenc.bench.plan import LLAMA_LIKE, BenchCase, make_plan, targets_plan
from posenc.bench.results import BackendInfo, BenchDocument, BenchRecord, MachineInfo, TargetCheck
from posenc.bench.shapes import PRESETS, Shape, parse_shape
from posenc.bench.targets import evaluate_targets
from posenc.bench.timing import RunSettings, Timing, TimingSettings, measure
from posenc.bench.workloads import UNITS, Workload, build_workload

__all__ = [
    "BACKEND_NAMES",
    "LLAMA_LIKE",
    "PRESETS",
    "UNITS",
    "Backend",
    "BackendInfo",
    "BenchCase",
    "BenchDocument",
    "BenchRecord",
    "CopyBandwidth",
    "MachineInfo",
    "RunSettings",
    "Shape",
    "SkipCase",
    "TargetCheck",
    "Timing",
    "TimingSettings",
    "Workload",
    "build_workload",
    "evaluate_targets",
    "get_backends",
    "make_plan",
    "measure",
    "measure_copy_bandwidth",
    "parse_shape",
    "run_bench",
    "targets_plan",
]
