"""Benchmark results: one record per (scheme, unit, table mode, shape, backend), kept in a JSON document.

The document is rewritten atomically after every record, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import ClassVar

from posenc.artifacts.files import write_text_atomic
from posenc.bench.bandwidth import CopyBandwidth
from posenc.bench.shapes import Shape
from posenc.bench.timing import RunSettings, Timing
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.export.manifest import OptimizedRecord
from posenc.records import Document, field

FORMAT = "posenc-bench/2"
"""``posenc-bench/1`` documents (before typed records) are refused with a request to re-run."""
STATUSES = ("ok", "skipped", "error")


@dataclasses.dataclass
class BenchRecord:
    """The outcome of one measurement.

    Attributes:
        scheme, unit, table_mode, backend: what was timed and where.
        shape: batch / new tokens / past length.
        config: attention geometry.
        status: ``ok``, ``skipped`` (backend or unit not available here; see ``reason``) or ``error``.
        reason: why skipped or what failed.
        timing: median, p90, mean, min and number of the timed calls when ``ok``.
        bytes_moved: the bytes one call must move: an op's inputs read and outputs written; a block step's bytes
            floor (weights + hidden in and out + every cached and new key and value read + the new ones written).
        bytes_per_s: ``bytes_moved / median``.
        roofline_ratio: ``bytes_per_s`` / copy bandwidth measured in the same run (``copy_bytes_per_s``
            when set, else the run's).
        graph: what graph optimization reported (passes and fusions applied), when a fused graph was timed.
        copy_bytes_per_s: copy bandwidth timed in the same alternating rounds as this record (large
            memory-bound ops, decode steps), so a shared machine's drift hits op and copy alike.
        flops: a block call's FLOPs (projections + dense ``QKᵀ`` and ``PV``).
        gemm_flops_per_s: the rate of an ONNX Runtime CPU GEMM of the same FLOPs timed in the same rounds (prefill).
        flops_ratio: ``flops / median`` ÷ ``gemm_flops_per_s``: the share of the GEMM roofline.
        unguarded: the same graph exported without the position guard, timed in the same rounds
            (:attr:`RunSettings.guard_cost`).
        artifact: the file name when a user's artifact was timed as it is.
    """

    scheme: str
    unit: str
    table_mode: str
    backend: str
    shape: Shape
    config: AttentionConfig
    status: str
    reason: str = ""
    timing: Timing | None = None
    bytes_moved: int | None = None
    bytes_per_s: float | None = None
    roofline_ratio: float | None = None
    graph: OptimizedRecord | None = None
    copy_bytes_per_s: float | None = None
    flops: int | None = field(optional=True, default=None)
    gemm_flops_per_s: float | None = field(optional=True, default=None)
    flops_ratio: float | None = field(optional=True, default=None)
    unguarded: Timing | None = field(optional=True, default=None)
    artifact: str | None = field(optional=True, default=None)
    """The file name of a user's artifact timed as it is (``posenc bench MODEL.onnx``); ``None``: a scheme."""
    dtype: str | None = field(optional=True, default=None)
    """The activation dtype of an artifact's graph (schemes are timed in float32)."""

    @property
    def median(self) -> float | None:
        return None if self.timing is None else self.timing.median

    @property
    def guard_cost(self) -> float | None:
        """What the position guard adds: ``median / unguarded median - 1`` (``None`` unless both were timed)."""
        if self.median is None or self.unguarded is None:
            return None
        return self.median / self.unguarded.median - 1.0


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """A backend of the run: what it is and whether it could run here (else why not)."""

    description: str
    available: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class TargetCheck:
    """One target: what was measured, the threshold, and whether it was met (``None``: not measured)."""

    name: str
    measured: float | None
    threshold: float
    passed: bool | None
    detail: str


@dataclasses.dataclass(frozen=True)
class MachineInfo:
    """Where the numbers were taken: CPU, cores, library versions."""

    platform: str
    processor: str
    cpu_count: int | None
    python: str
    posenc: str
    torch: str
    numpy: str
    onnxruntime: str | None


def machine_info() -> MachineInfo:
    """The :class:`MachineInfo` of this process."""
    import numpy
    import torch

    import posenc

    try:
        import onnxruntime

        ort_version: str | None = onnxruntime.__version__
    except ImportError:
        ort_version = None
    return MachineInfo(
        platform=platform.platform(),
        processor=_cpu_model() or platform.processor(),
        cpu_count=os.cpu_count(),
        python=platform.python_version(),
        posenc=posenc.__version__,
        torch=torch.__version__,
        numpy=numpy.__version__,
        onnxruntime=ort_version,
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass
class BenchDocument(Document):
    """Everything one ``posenc bench`` run measured, plus how and where (JSON: :meth:`to_dict`)."""

    FORMAT: ClassVar[str] = FORMAT
    REMEDY: ClassVar[str] = "re-run `posenc bench -o DIR` with this posenc version"

    settings: RunSettings
    copy_bandwidth: CopyBandwidth | None = None
    backends: dict[str, BackendInfo] = dataclasses.field(default_factory=dict)
    records: list[BenchRecord] = field(key="results", default_factory=list)
    targets: list[TargetCheck] = dataclasses.field(default_factory=list)
    status: str = "running"
    machine: MachineInfo = dataclasses.field(default_factory=machine_info)
    created: str = dataclasses.field(default_factory=_now)
    finished: str | None = None
    format: str = FORMAT

    def add(self, record: BenchRecord) -> None:
        if record.status not in STATUSES:
            raise ValueError(f"record status {record.status!r} not in {STATUSES}")
        self.records.append(record)

    def ok(self) -> list[BenchRecord]:
        return [r for r in self.records if r.status == "ok"]

    def finish(self, status: str) -> None:
        self.status = status
        self.finished = _now()

    def save(self, path: str | Path) -> Path:
        """Write the JSON document atomically."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> BenchDocument:
        """Read a document written by :meth:`save`.

        Raises:
            ConfigError: the file is missing or not JSON.
            ModelFileError: not a posenc bench result of this version (:meth:`from_dict`; says: re-run).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path} does not exist; run `posenc bench -o DIR` first.") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc}).") from None
        return cls.from_dict(data, str(path))
