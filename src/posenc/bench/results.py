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
from typing import Any

from posenc.bench.bandwidth import CopyBandwidth
from posenc.bench.shapes import Shape
from posenc.errors import ConfigError
from posenc.report.files import atomic_write_text

FORMAT = "posenc-bench/1"
STATUSES = ("ok", "skipped", "error")


@dataclasses.dataclass
class BenchRecord:
    """The outcome of one measurement.

    Attributes:
        scheme, unit, table_mode, backend: what was timed and where.
        shape: batch / new tokens / past length.
        config: attention geometry (``AttentionConfig.to_dict()``).
        status: ``ok``, ``skipped`` (backend or unit not available here; see ``reason``) or ``error``.
        reason: why skipped or what failed.
        timing: ``median_s``, ``p90_s``, ``mean_s``, ``min_s``, ``runs`` when ``ok``.
        bytes_moved: inputs read + outputs written + projection weights read by one call.
        bytes_per_s: ``bytes_moved / median``.
        roofline_ratio: ``bytes_per_s`` / copy bandwidth measured in the same run (``copy_bytes_per_s``
            when set, else the run's).
        graph: what graph optimization reported (fusions applied), when a fused graph was timed.
        copy_bytes_per_s: copy bandwidth timed in the same alternating rounds as this record (large
            memory-bound ops), so a shared machine's drift hits op and copy alike.
    """

    scheme: str
    unit: str
    table_mode: str
    backend: str
    shape: Shape
    config: dict[str, Any]
    status: str
    reason: str = ""
    timing: dict[str, Any] | None = None
    bytes_moved: int | None = None
    bytes_per_s: float | None = None
    roofline_ratio: float | None = None
    graph: dict[str, Any] | None = None
    copy_bytes_per_s: float | None = None

    @property
    def median(self) -> float | None:
        return None if self.timing is None else float(self.timing["median_s"])

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["shape"] = self.shape.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchRecord:
        values = dict(data)
        values["shape"] = Shape.from_dict(values["shape"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def machine_info() -> dict[str, Any]:
    """Where the numbers were taken: CPU, cores, library versions."""
    import numpy
    import torch

    import posenc

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "posenc": posenc.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        info["onnxruntime"] = None
    return info


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
class BenchDocument:
    """Everything one ``posenc bench`` run measured, plus how and where."""

    settings: dict[str, Any]
    copy_bandwidth: CopyBandwidth | None = None
    backends: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    records: list[BenchRecord] = dataclasses.field(default_factory=list)
    targets: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    status: str = "running"
    machine: dict[str, Any] = dataclasses.field(default_factory=machine_info)
    created: str = dataclasses.field(default_factory=_now)
    finished: str | None = None

    def add(self, record: BenchRecord) -> None:
        if record.status not in STATUSES:
            raise ValueError(f"record status {record.status!r} not in {STATUSES}")
        self.records.append(record)

    def ok(self) -> list[BenchRecord]:
        return [r for r in self.records if r.status == "ok"]

    def finish(self, status: str) -> None:
        self.status = status
        self.finished = _now()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "status": self.status,
            "created": self.created,
            "finished": self.finished,
            "machine": self.machine,
            "settings": self.settings,
            "copy_bandwidth": None if self.copy_bandwidth is None else self.copy_bandwidth.to_dict(),
            "backends": self.backends,
            "results": [r.to_dict() for r in self.records],
            "targets": self.targets,
        }

    def save(self, path: str | Path) -> Path:
        """Write the JSON document atomically."""
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchDocument:
        if data.get("format") != FORMAT:
            raise ConfigError(f"not a posenc bench result (format {data.get('format')!r}, expected {FORMAT!r}).")
        bandwidth = data.get("copy_bandwidth")
        return cls(
            settings=dict(data.get("settings", {})),
            copy_bandwidth=None if bandwidth is None else CopyBandwidth.from_dict(bandwidth),
            backends=dict(data.get("backends", {})),
            records=[BenchRecord.from_dict(r) for r in data.get("results", [])],
            targets=list(data.get("targets", [])),
            status=str(data.get("status", "unknown")),
            machine=dict(data.get("machine", {})),
            created=str(data.get("created", "")),
            finished=data.get("finished"),
        )

    @classmethod
    def load(cls, path: str | Path) -> BenchDocument:
        """Read a document written by :meth:`save`.

        Raises:
            ConfigError: the file is missing or not a posenc bench result.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path} does not exist; run `posenc bench -o DIR` first.") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc}).") from None
        return cls.from_dict(data)
