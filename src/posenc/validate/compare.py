"""The one comparison path of posenc: references against candidates, through polygraphy.

Every numeric check of posenc runs here: ``posenc validate`` (:func:`posenc.validate.validate_onnx`), the
position sweep (:mod:`posenc.validate.sweep`) and the before/after check of ``posenc optimize``
(:func:`posenc.validate.optimize_check.check_ort_parity`, handed to :func:`posenc.graphs.optimize_file` by its
callers, because the graph layer does not import this one).

The path, step by step:

1. **Shapes and feeds** (:mod:`posenc.validate.feeds`): one shape type, :class:`posenc.export.Shape`
   ``(batch, seq, past)``, shrunk to a short precomputed table by one rule (:func:`~posenc.validate.feeds.fit_shapes`);
   feeds from the manifest (:func:`posenc.export.make_feed`, realistic position ids, checked against the
   table) or, for a model without one, random feeds of the graph's inputs (:func:`~posenc.validate.feeds.random_feed`).
2. **bf16** (:func:`posenc.validate.bf16.prepare_for_ort`): a bf16 graph runs on ONNX Runtime CPU emulated
   (float32 arithmetic, bf16 rounding where the graph stores bf16), its bf16 inputs carried as float32.
3. **Runners** (:mod:`posenc.validate.runners`), all polygraphy ``BaseRunner``s: the float64 eager posenc
   reference (:class:`~posenc.validate.runners.EagerTorchRunner`), any PyTorch callable
   (:class:`~posenc.validate.runners.TorchModuleRunner`), ONNX Runtime (:func:`~posenc.validate.runners.ort_runner`,
   polygraphy's ``OnnxrtRunner`` on ``SessionFromOnnx``) and TensorRT (:func:`posenc.engine.engine_runner`,
   polygraphy's ``TrtRunner``).
4. **Running and collecting**: polygraphy's ``Comparator.run`` runs every runner on every feed; its
   ``RunResults`` are kept (``posenc validate --runs`` saves them; polygraphy reloads them).
5. **Verdict** (:func:`compare`): every candidate against every :class:`Reference`, per feed and per
   output, by the one tolerance rule :func:`posenc.validate.tolerance.outside_tolerance` (an element fails
   only beyond both ``atol`` and ``rtol * |reference|``). polygraphy's ``SimpleCompareFunc`` is not part of
   the verdict: its relative error divides by the runtime's output, not by the reference, so it would be a
   second, slightly different rule. Each :class:`ComparisonRow` names its reference and candidate.

References versus candidates. A :class:`Reference` is a runner plus a human description, optional
per-output tolerance overrides, and an ``informational`` flag (rows against it are reported but left out of
the verdict, e.g. "error against transformers' own float32 angles at long positions"). Candidates are the
runtimes under test. A new reference plugs in as a :class:`~posenc.validate.runners.TorchModuleRunner`
wrapping a callable from feed dict (graph input names) to ``{output name: tensor}``. Rows cover the
outputs a reference returns, so it may cover a subset of the graph's outputs; an output a candidate lacks,
or returns in another shape, fails with an infinite error. Parity reports list each reference with its
description and name it in a ``reference`` column of every row::

    from posenc.validate import EAGER, Reference, TorchModuleRunner, validate_onnx

    hf = Reference(TorchModuleRunner(fn, "hf-llama-fp32", ["out"]),      # fn(feed) -> {"out": tensor}
                   "transformers LlamaAttention, checkpoint weights, fp32",
                   tolerances={"out": Tolerance(atol=1e-4, rtol=1e-4)})
    report = validate_onnx("block.onnx", references=[EAGER, hf])      # rows against both, one verdict

or, below :func:`~posenc.validate.validate_onnx`, ``compare(references, candidates, feeds, tolerances, shapes=...)``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.artifacts.files import write_text_atomic
from posenc.errors import ConfigError
from posenc.export.shapes import Shape
from posenc.records import field, to_json
from posenc.schemes.base import Tolerance
from posenc.validate.runners import (
    FLOAT32_DESCRIPTION,
    FLOAT32_NAME,
    REFERENCE_DESCRIPTION,
    EagerTorchRunner,
    TorchModuleRunner,
    feed_metadata,
)
from posenc.validate.tolerance import margin_of, outside_tolerance


@dataclasses.dataclass(frozen=True)
class ErrorBound:
    """Rows that hold each candidate to ``reference`` within ``factor`` times the error the owning reference itself
    makes against ``reference`` on the same feed and output (at least ``floor``): a half-precision graph against
    the exact rendering, allowed twice what the model run in that half precision gets wrong."""

    reference: str
    factor: float = 2.0
    floor: float = 1e-6

    def label(self, owner: str) -> str:
        return f"{self.reference} (≤ {self.factor:g} × {owner}'s error)"


@dataclasses.dataclass(frozen=True)
class Float32Floor:
    """What float32 arithmetic alone gets wrong: ``reference`` (the module in float32 fed exact angles) against
    ``exact`` (the module in float64), per feed and output. No float32 rendering of a wide layer gets closer than its
    own rounding, so rows of float32 candidates allow at least ``factor`` times that error: against the exact
    reference, ``factor`` times what the module in float32 gets wrong; against another float32 rendering (the
    model's own ``hf-fp32``, which rounds too), the two roundings together.
    """

    reference: str
    exact: str
    factor: float = 3.0
    exempt: tuple[str, ...] = ()
    """Outputs whose tolerance the caller set explicitly: held to it as given."""


@dataclasses.dataclass(frozen=True)
class Reference:
    """A runner whose outputs candidates are held to.

    Attributes:
        runner: a polygraphy ``BaseRunner`` (its ``name`` fills the ``reference`` column).
        description: what it is, for reports (e.g. "float64 eager posenc reference (CPU)").
        tolerances: per-output overrides of the comparison's tolerances, for rows against this reference.
        informational: rows against it are reported but do not count towards the verdict.
        judged_by: the name of a more exact reference of the same comparison. On each feed and output where this
            reference's own outputs fall outside the tolerance of that one (transformers' float32 angles far
            from the start), rows against this reference are informational, with a note: decided on the data,
            whichever shape it came from.
        bound: rows of an :class:`ErrorBound` derived from this reference (a model run in half precision).
        floor: the float32 floor of float32 candidates (:class:`Float32Floor`): on each feed and output, rows
            against this reference allow at least ``factor`` times the error float32 arithmetic alone makes there,
            with a note where that widens the tolerance.
        measuring: run only so that another reference's :attr:`floor` can measure float32's own error: no rows.
    """

    runner: Any
    description: str
    tolerances: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)
    informational: bool = False
    judged_by: str | None = None
    bound: ErrorBound | None = None
    floor: Float32Floor | None = None
    measuring: bool = False

    @property
    def name(self) -> str:
        return str(self.runner.name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "informational": self.informational,
            "tolerances": {k: {"atol": t.atol, "rtol": t.rtol} for k, t in self.tolerances.items()},
            "judged_by": self.judged_by,
            "bound": None if self.bound is None else dataclasses.asdict(self.bound),
            "floor": None if self.floor is None else dataclasses.asdict(self.floor),
            "measuring": self.measuring,
        }


@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """One output of one candidate against one reference on one feed: largest errors, tolerance, verdict.

    ``max_abs`` / ``max_rel`` are taken where the reference is finite (elsewhere it must be matched exactly);
    ``max_rel`` divides by ``|reference|``. A missing output or a shape mismatch gives ``inf`` and fails.
    """

    shape: Shape | None
    reference: str
    runner: str
    output: str
    max_abs: float = field(key="max_abs_error")
    max_rel: float = field(key="max_rel_error")
    atol: float = field(key="atol")
    rtol: float = field(key="rtol")
    passed: bool = field(key="passed")
    informational: bool = False
    feed: int = 0
    """Index of the feed (the position in ``shapes`` / ``feeds``)."""
    margin: float | None = field(optional=True, default=None)
    """The largest ``|got - ref| / max(atol, rtol·|ref|)`` (:func:`~posenc.validate.tolerance.margin_of`): how
    close the row is to failing; it passes at most 1."""
    note: str = field(optional=True, default="")
    """Why a row that would count is informational (its reference drifts from a more exact one here)."""

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


class Verdict:
    """The verdict over ``self.rows``: rows against informational references are left out."""

    rows: list[ComparisonRow]

    @property
    def passed(self) -> bool:
        """Every row that counts (against a non-informational reference) passed, and there is one."""
        counted = [row for row in self.rows if not row.informational]
        return bool(counted) and all(row.passed for row in counted)

    def failures(self) -> list[ComparisonRow]:
        """Failed rows that count towards the verdict."""
        return [row for row in self.rows if not row.passed and not row.informational]

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    def to_markdown(self) -> str:
        raise NotImplementedError

    def save(
        self, markdown: str | os.PathLike[str] | None = None, json_path: str | os.PathLike[str] | None = None
    ) -> list[Path]:
        """Write the Markdown table and the JSON report (each atomically); returns the paths written."""
        written = []
        if markdown is not None:
            written.append(write_text_atomic(markdown, self.to_markdown()))
        if json_path is not None:
            written.append(write_text_atomic(json_path, json.dumps(self.to_dict(), indent=2) + "\n"))
        return written


@dataclasses.dataclass
class Comparison(Verdict):
    """Result of :func:`compare`: rows, the references used, and polygraphy's ``RunResults``."""

    rows: list[ComparisonRow]
    references: list[Reference]
    run_results: Any

    def outputs(self, runner: str, feed: int = 0) -> dict[str, np.ndarray]:
        """``{output name: array}`` that ``runner`` returned for feed number ``feed``."""
        for name, iterations in self.run_results.items():
            if name == runner:
                return dict(iterations[feed].items())
        raise ConfigError(f"no runner {runner!r} in this comparison; runners: {list(self.run_results.keys())}.")


def eager_reference(module: Any, manifest: Any, feed: Mapping[str, np.ndarray]) -> Reference:
    """The float64 eager posenc reference (:class:`~posenc.validate.runners.EagerTorchRunner`) for feeds like
    ``feed`` (its input dtypes, e.g. float32 for the bf16 inputs of an emulated graph).

    Args:
        module: the float64 unit module (:func:`posenc.export.load_eager`).
        manifest: the model's manifest.
        feed: one feed as it will be run.
    """
    dtypes = {name: np.asarray(array).dtype for name, array in feed.items()}
    return Reference(EagerTorchRunner(module, manifest, feed_dtypes=dtypes), REFERENCE_DESCRIPTION)


def float32_floor(
    module: Any, manifest: Any, feed: Mapping[str, np.ndarray], exact: Reference
) -> tuple[Reference, Reference]:
    """``exact`` (the float64 eager reference) with a :class:`Float32Floor`, and the measuring reference the floor
    reads: the same module in float32 (a copy; its tables are the float64 ones rounded once, so it measures
    float32's arithmetic, not an angle computed in float32).

    Args:
        module: the float64 unit module ``exact`` runs.
        manifest: the model's manifest.
        feed: one feed as it will be run.
        exact: the float64 reference the floor widens.

    Returns:
        ``(exact with its floor, the measuring reference)``: pass both to :func:`compare`.
    """
    import torch

    dtypes = {name: np.asarray(array).dtype for name, array in feed.items()}
    single = copy.deepcopy(module).float()
    runner = EagerTorchRunner(single, manifest, feed_dtypes=dtypes, name=FLOAT32_NAME, dtype=torch.float32)
    measuring = Reference(runner, FLOAT32_DESCRIPTION, measuring=True)
    return dataclasses.replace(exact, floor=Float32Floor(FLOAT32_NAME, exact.name)), measuring


def compare(
    references: Sequence[Reference],
    candidates: Sequence[Any],
    feeds: Sequence[Mapping[str, np.ndarray]],
    tolerances: Mapping[str, Tolerance],
    *,
    shapes: Sequence[Shape | None] | None = None,
    quiet: bool = True,
) -> Comparison:
    """Run references and candidates on every feed (polygraphy ``Comparator.run``) and compare.

    Args:
        references: what the candidates are held to (at least one).
        candidates: polygraphy runners under test (at least one).
        feeds: ``{graph input name: array}`` per run.
        tolerances: ``{output name: Tolerance}`` for every output a reference returns (a reference's own
            ``tolerances`` take precedence for its rows).
        shapes: the :class:`Shape` of each feed, for the rows (``None`` entries for other feeds).
        quiet: silence polygraphy's logging.

    Returns:
        :class:`Comparison`; rows ordered by feed, reference, candidate, then the reference's outputs.

    Raises:
        ConfigError: no reference, candidate or feed; only informational references; two runners share a
            name; ``shapes`` does not match ``feeds``; an output has no tolerance.
    """
    from polygraphy.comparator import Comparator
    from polygraphy.logger import G_LOGGER

    shapes = list(shapes) if shapes is not None else [None] * len(feeds)
    if not references or not candidates or not feeds:
        raise ConfigError("a comparison needs at least one reference, one candidate and one feed.")
    if all(ref.informational or ref.measuring for ref in references):
        raise ConfigError("every reference is informational, so nothing would decide the verdict; add one that counts.")
    if len(shapes) != len(feeds):
        raise ConfigError(f"{len(shapes)} shapes for {len(feeds)} feeds; give one shape per feed.")
    known = {ref.name for ref in references}
    for ref in references:
        for named in () if ref.floor is None else (ref.floor.reference, ref.floor.exact):
            if named not in known:
                raise ConfigError(
                    f"reference {ref.name!r} measures float32's error with {named!r}, which is not a reference of "
                    f"this comparison ({sorted(known)}); pass it."
                )
        for other in (ref.judged_by, None if ref.bound is None else ref.bound.reference):
            if other is not None and (other not in known or other == ref.name):
                raise ConfigError(
                    f"reference {ref.name!r} names {other!r} as its more exact reference, which is not another "
                    f"reference of this comparison ({sorted(known)}); pass both."
                )
    runners = [ref.runner for ref in references] + list(candidates)
    names = [r.name for r in runners]
    if len(set(names)) != len(names):
        raise ConfigError(f"runner names must be unique in a comparison, got {names}; pass name= to the runners.")
    for runner in runners:
        if isinstance(runner, TorchModuleRunner) and runner.input_metadata is None:
            runner.input_metadata = feed_metadata(feeds[0])
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL if quiet else G_LOGGER.INFO):
        results = Comparator.run(runners, data_loader=[dict(feed) for feed in feeds])
    collected = {name: [dict(it.items()) for it in iterations] for name, iterations in results.items()}
    rows = []
    for index, shape in enumerate(shapes):
        for ref in references:
            if ref.measuring:
                continue
            expected = collected[ref.name][index]
            for candidate in candidates:
                got = collected[candidate.name][index]
                for output in expected:
                    tol, widened = _floor_tolerance(ref, output, collected, index, _tolerance(ref, output, tolerances))
                    note = _drift_note(ref, output, expected, collected, index, tol) or widened
                    rows.append(
                        _row(shape, index, ref.name, candidate.name, output, got.get(output), expected[output], tol)
                    )
                    if ref.informational or (note and note != widened):
                        rows[-1] = dataclasses.replace(rows[-1], informational=True, note=note)
                    elif note:
                        rows[-1] = dataclasses.replace(rows[-1], note=note)
                    if ref.bound is not None:
                        exact = collected[ref.bound.reference][index]
                        allowed = max(ref.bound.factor * _max_abs(expected[output], exact[output]), ref.bound.floor)
                        label = ref.bound.label(ref.name)
                        bound = Tolerance(atol=allowed, rtol=0.0)
                        rows.append(
                            _row(shape, index, label, candidate.name, output, got.get(output), exact[output], bound)
                        )
    return Comparison(rows=rows, references=list(references), run_results=results)


def _tolerance(ref: Reference, output: str, tolerances: Mapping[str, Tolerance]) -> Tolerance:
    tol = ref.tolerances.get(output) or tolerances.get(output)
    if tol is None:
        raise ConfigError(
            f"no tolerance for output {output!r} of reference {ref.name!r}; "
            f"give it in tolerances= or in the reference's tolerances."
        )
    return tol


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a64.shape != b64.shape:
        return float("inf")
    finite = np.isfinite(b64)
    return float(np.abs(a64 - b64)[finite].max(initial=0.0))


def _floor_tolerance(
    ref: Reference,
    output: str,
    collected: Mapping[str, list[dict[str, np.ndarray]]],
    index: int,
    tol: Tolerance,
) -> tuple[Tolerance, str]:
    """``tol`` with its atol raised to :attr:`Float32Floor.factor` times float32's own error on this feed and output
    (:attr:`Reference.floor`), and a note where that raises it; ``(tol, "")`` otherwise."""
    if ref.floor is None or output in ref.floor.exempt:
        return tol, ""
    floor = collected[ref.floor.reference][index].get(output)
    exact = collected[ref.floor.exact][index].get(output)
    if floor is None or exact is None or np.shape(floor) != np.shape(exact):
        return tol, ""
    error = _max_abs(floor, exact)
    allowed = ref.floor.factor * error
    if allowed <= tol.atol:
        return tol, ""
    note = (
        f"atol {allowed:.2e}: {ref.floor.factor:g} × the {error:.2e} that float32 arithmetic alone makes here "
        f"({ref.floor.reference} against {ref.floor.exact})"
    )
    return Tolerance(atol=allowed, rtol=tol.rtol), note


def _drift_note(
    ref: Reference,
    output: str,
    expected: Mapping[str, np.ndarray],
    collected: Mapping[str, list[dict[str, np.ndarray]]],
    index: int,
    tol: Tolerance,
) -> str:
    """Why rows against ``ref`` are informational for this feed and output: ``ref`` itself falls outside ``tol``
    of its more exact reference (:attr:`Reference.judged_by`) here; ``""`` where it stays within (rows count)."""
    if ref.judged_by is None:
        return ""
    exact = collected[ref.judged_by][index].get(output)
    if exact is None or np.shape(exact) != np.shape(expected[output]):
        return ""
    if not outside_tolerance(expected[output], exact, tol).any():
        return ""
    drift = _max_abs(expected[output], exact)
    return (
        f"{ref.name} itself is {drift:.2e} from {ref.judged_by} here (beyond its tolerance: its float32 angles "
        f"or arithmetic); {ref.judged_by} decides"
    )


def _row(
    shape: Shape | None,
    index: int,
    reference: str,
    runner: str,
    output: str,
    got: np.ndarray | None,
    expected: np.ndarray,
    tol: Tolerance,
) -> ComparisonRow:
    ref64 = np.asarray(expected, dtype=np.float64)
    if got is None or np.shape(got) != ref64.shape:
        max_abs = max_rel = margin = float("inf")
        passed = False
    else:
        got64 = np.asarray(got, dtype=np.float64)
        finite = np.isfinite(ref64)
        err = np.abs(got64 - ref64)[finite]
        scale = np.abs(ref64)[finite]
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(scale > 0, err / np.where(scale > 0, scale, 1.0), np.where(err > 0, np.inf, 0.0))
        max_abs = float(err.max(initial=0.0))
        max_rel = float(rel.max(initial=0.0))
        passed = not bool(outside_tolerance(got64, ref64, tol).any())
        margin = margin_of(got64, ref64, tol)
    return ComparisonRow(
        shape=shape,
        reference=reference,
        runner=runner,
        output=output,
        max_abs=max_abs,
        max_rel=max_rel,
        atol=tol.atol,
        rtol=tol.rtol,
        passed=passed,
        feed=index,
        margin=margin,
    )
