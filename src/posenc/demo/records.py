"""The records of ``posenc demo``: what each stage of each scheme's pipeline produced, and the run as a whole.

Worker processes return these (they pickle), :mod:`posenc.demo.report` renders them, and ``demo.json`` is their
JSON form (:func:`posenc.records.to_json`; :meth:`DemoResult.load` reads it back strictly). A new section of the
demo is a new record type here, a field of :class:`DemoResult` and a section in :mod:`posenc.demo.report`.

Stage outcomes share :class:`StageOutcome` (``status`` ``ok``/``error``, ``seconds``, ``reason``,
``traceback``); what a stage produced is in its own fields, left at their defaults when it failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import ClassVar

from posenc.bench.plan import LLAMA_LIKE
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.export.manifest import OptimizedRecord
from posenc.records import Document, field
from posenc.validate.sweep import SweepReport

DEMO_CONFIG = LLAMA_LIKE
QUICK_CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=256)
"""``--quick``: head_dim 16, grouped-query 4/2 heads, 256 positions."""
DEMO_FORMAT = "posenc.demo/2"


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """What ``posenc demo`` does.

    Attributes:
        output: the report folder.
        quick: tiny geometry, one table mode per scheme, short sweep and benchmark (for tests, ~1 minute).
        schemes: schemes to run (default: every registered scheme).
        jobs: worker processes for the per-scheme pipeline (export is the slow part).
        threads: intra-op threads of the benchmark.
        engine_targets: compute capabilities of the engines (default: sm89 with TensorRT-RTX, the local
            GPU with datacenter TensorRT).
        keep_models: keep ONNX graphs and engines under ``OUTPUT/models`` (they are large).
        progress: progress lines on stderr.
    """

    output: Path = Path("report")
    quick: bool = False
    schemes: tuple[str, ...] = ()
    jobs: int = min(2, os.cpu_count() or 1)
    threads: int = os.cpu_count() or 1
    engine_targets: tuple[str, ...] = ()
    keep_models: bool = False
    progress: bool = True
    checkpoints: tuple[str, ...] | None = None
    """Sample checkpoints of the real-checkpoint section (``posenc.checkpoints.samples``): ``None`` = the
    default set (every sample; ``--quick``: a few), ``()`` = none."""

    def __post_init__(self) -> None:
        for name in ("jobs", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}.")

    @property
    def config(self) -> AttentionConfig:
        return QUICK_CONFIG if self.quick else DEMO_CONFIG


# --------------------------------------------------------------------------------------------------
# Stages of one scheme's pipeline
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageOutcome:
    """How a stage ended: ``ok`` or ``error`` (with the reason and, for a bug, the traceback), and how long."""

    status: str
    seconds: float = 0.0
    reason: str = field(optional=True, default="")
    traceback: str = field(optional=True, default="")

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclasses.dataclass(frozen=True)
class ExportStage(StageOutcome):
    """The exported block: file, size, opset and the exporter's notes."""

    path: str = field(optional=True, default="")
    bytes: int = field(optional=True, default=0)
    opset: int = field(optional=True, default=0)
    notes: tuple[str, ...] = field(optional=True, default=())


@dataclasses.dataclass(frozen=True)
class OptimizeStage(StageOutcome):
    """The graph optimized for a target and what ``posenc optimize`` recorded (passes, parity)."""

    path: str = field(optional=True, default="")
    optimized: OptimizedRecord | None = field(optional=True, default=None)

    @property
    def counts(self) -> dict[str, int]:
        """Pass name -> matches rewritten (empty when the stage failed)."""
        return {} if self.optimized is None else self.optimized.counts


@dataclasses.dataclass(frozen=True)
class WorstOutput:
    """The output and shape closest to (or furthest past) its tolerance."""

    output: str
    shape: tuple[int, int, int]
    """``(batch, seq, past)``."""
    max_abs: float
    atol: float
    rtol: float


@dataclasses.dataclass(frozen=True)
class ParityStage(StageOutcome):
    """One graph's parity against the float64 eager reference on ONNX Runtime (details in ``parity/``)."""

    passed: bool = field(optional=True, default=False)
    shapes: int = field(optional=True, default=0)
    outputs: int = field(optional=True, default=0)
    max_abs: float = field(optional=True, default=0.0)
    worst: WorstOutput | None = field(optional=True, default=None)
    failures: int = field(optional=True, default=0)
    details: str = field(optional=True, default="")
    """File name of the per-shape Markdown table."""


@dataclasses.dataclass(frozen=True)
class EngineStage:
    """The TensorRT engine build: ``built``, ``failed`` or ``skipped`` (no backend), with what went in."""

    status: str
    reason: str = field(optional=True, default="")
    backend: str = field(optional=True, default="")
    targets: tuple[str, ...] = field(optional=True, default=())
    bytes: int | None = field(optional=True, default=None)
    graph: str = field(optional=True, default="")
    """Which graph was built: optimized for trt, or the export when that optimization failed."""
    graph_reason: str = field(optional=True, default="")
    seconds: float | None = field(optional=True, default=None)


@dataclasses.dataclass(frozen=True)
class PipelineRecord:
    """Everything one scheme in one table mode went through: export -> optimize -> parity -> engine."""

    scheme: str
    table_mode: str
    export: ExportStage
    optimize: OptimizeStage | None = field(optional=True, default=None)
    parity: dict[str, ParityStage] = field(optional=True, default_factory=dict)
    """Graph (``exported``, ``ort-cpu``) -> its parity."""
    engine: EngineStage | None = field(optional=True, default=None)


@dataclasses.dataclass(frozen=True)
class CheckpointParity(StageOutcome):
    """One graph (``exported`` or ``ort-cpu``) of one table mode against the checkpoint's own transformers module.

    ``worst``: reference name (``hf-fp32``, ``hf-fp64, fp64 angles``, ``eager-fp64``; ``"<name> (informational)"``
    for its informational rows, e.g. where transformers' own fp32 angles drift) -> the largest absolute error.
    """

    graph: str = field(optional=True, default="")
    table_mode: str = field(optional=True, default="")
    passed: bool = field(optional=True, default=False)
    worst: dict[str, float] = field(optional=True, default_factory=dict)
    details: str = field(optional=True, default="")


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """One sample checkpoint: built, its layer exported with its weights, validated against its module, engine."""

    sample: str
    title: str
    model_type: str
    layer: int | None
    layer_type: str | None
    checkpoint: StageOutcome
    parity: list[CheckpointParity] = dataclasses.field(default_factory=list)
    engine: EngineStage | None = field(optional=True, default=None)

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("passed",)

    @property
    def passed(self) -> bool:
        """Every graph of every table mode ran and passed against the checkpoint's module."""
        return bool(self.parity) and all(p.ok and p.passed for p in self.parity)


@dataclasses.dataclass(frozen=True)
class SweepStage(StageOutcome):
    """The position sweep (error against position) of the report."""

    report: SweepReport | None = field(optional=True, default=None)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EngineSetup:
    """The TensorRT backend every engine is built with (``None``: none installed, see ``reason``)."""

    backend: str | None
    reason: str
    targets: tuple[str, ...]


@dataclasses.dataclass
class DemoResult(Document):
    """Everything the report shows (``demo.json``: :meth:`to_dict`, read back strictly by :meth:`load`)."""

    FORMAT: ClassVar[str] = DEMO_FORMAT
    REMEDY: ClassVar[str] = "re-run `posenc demo` with this posenc version"

    options: DemoOptions
    config: AttentionConfig
    schemes: tuple[str, ...]
    engine: EngineSetup
    pipeline: list[PipelineRecord] = dataclasses.field(default_factory=list)
    checkpoints: list[CheckpointRecord] = dataclasses.field(default_factory=list)
    checkpoint_reason: str = ""
    """Why the real-checkpoint section did not run (transformers missing, ``--no-checkpoints``), or empty."""
    sweep: SweepStage | None = None
    status: str = "running"
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    format: str = DEMO_FORMAT

    def parity_stages(self) -> list[ParityStage]:
        """Every graph's parity outcome, in pipeline order."""
        return [stage for record in self.pipeline for stage in record.parity.values()]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DemoResult:
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))
