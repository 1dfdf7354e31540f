"""The one tolerance policy of posenc: how close a deployed output must be to the float64 eager reference.

``tolerance_for(scheme, dtype, output)`` = the scheme's own per-dtype tolerance
(:meth:`posenc.schemes.base.SchemeSpec.tolerance`) scaled by the per-output rule in
:data:`OUTPUT_RULES`, where ``dtype`` is the dtype of that output tensor (not of the graph: a score op
of an fp16 graph returns its bias in the float32 of its tables, and is held to float32 tolerance).
A value passes when ``|got - ref| <= atol`` or ``|got - ref| <= rtol * |ref|``: an element fails only if
it exceeds both (:func:`outside_tolerance`; a non-finite reference must be matched exactly). Every check
of posenc uses that function: the parity table, the position sweep and the graph passes' before/after
check, all through :func:`posenc.validate.compare.compare`. (polygraphy's ``SimpleCompareFunc`` is not used
for verdicts: it measures the relative error against the runtime's output instead of the reference.)

Models without a manifest, or of a scheme this posenc does not know, get the per-dtype defaults
:data:`posenc.schemes.DEFAULT_TOLERANCES` (:func:`tolerances_of`).

Per-output rules: :data:`OUTPUT_RULES` maps an output name to scales of the scheme tolerance (with
the reason and the dtypes they apply to). It is empty today because the measurements do not call for
any: across the registry's parity matrix the block outputs (``out`` after softmax and the output
projection, ``present_key``/``present_value``) stay within the op tolerance of their scheme, e.g. the
bf16 ``out`` of RoPE and ALiBi blocks at most 2.8e-3 against an atol of 3e-2. Add a rule here, with its
evidence, when an output needs more room than its scheme's op.

Everything else uses the scheme tolerance unchanged. Callers may override per output
(``validate_onnx(..., tolerances={"out": Tolerance(...)})``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from posenc.dtypes import dtype_name
from posenc.errors import ConfigError
from posenc.export.manifest import Manifest
from posenc.schemes import DEFAULT_TOLERANCES, get_spec
from posenc.schemes.base import SchemeSpec, Tolerance


@dataclasses.dataclass(frozen=True)
class OutputRule:
    """Scales applied to the scheme tolerance for one output name, with the reason."""

    atol_scale: float = 1.0
    rtol_scale: float = 1.0
    reason: str = ""
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    """Dtypes the rule applies to (float32 graphs keep the scheme tolerance)."""


OUTPUT_RULES: dict[str, OutputRule] = {}
"""Output name -> scales of the scheme tolerance (none needed today; see the module docstring)."""


def tolerance_for(scheme: str | SchemeSpec, dtype: str | torch.dtype, output: str) -> Tolerance:
    """Tolerance of ``output`` of a ``scheme`` graph in ``dtype`` against the float64 reference.

    Args:
        scheme: scheme name or spec.
        dtype: dtype of the output tensor (fp32/fp16/bf16 or torch dtype).
        output: graph output name (``out``, ``q_rot``, ``bias``, ...).
    """
    spec = get_spec(scheme) if isinstance(scheme, str) else scheme
    base = spec.tolerance(dtype)
    rule = OUTPUT_RULES.get(output)
    if rule is None or dtype_name(dtype) not in rule.dtypes:
        return base
    return Tolerance(atol=base.atol * rule.atol_scale, rtol=base.rtol * rule.rtol_scale)


def tolerances_for(
    scheme: str | SchemeSpec,
    outputs: Mapping[str, str | torch.dtype],
    overrides: Mapping[str, Tolerance] | None = None,
) -> dict[str, Tolerance]:
    """``{output: Tolerance}`` for ``{output name: output dtype}``, with caller overrides applied last."""
    result = {name: tolerance_for(scheme, dtype, name) for name, dtype in outputs.items()}
    for name, tol in (overrides or {}).items():
        result[name] = tol
    return result


def tolerances_of(
    manifest: Manifest | None, model: Any = None, overrides: Mapping[str, Tolerance] | None = None
) -> dict[str, Tolerance]:
    """``{output: Tolerance}`` of a model: its manifest's scheme per output dtype (:func:`tolerances_for`).

    Without a manifest, or for a scheme this posenc does not know (a manifest from a newer version), each
    output of ``model`` (an ``onnx.ModelProto``) gets :data:`posenc.schemes.DEFAULT_TOLERANCES` of its dtype.
    """
    if manifest is not None:
        outputs: dict[str, Any] = {o.name: o.dtype for o in manifest.outputs}
        try:
            return tolerances_for(manifest.scheme, outputs, overrides)
        except ConfigError:
            pass
    else:
        from onnx import helper

        if model is None:
            raise ConfigError("tolerances_of needs a manifest or the ONNX model (for its output dtypes).")
        outputs = {}
        for value in model.graph.output:
            try:
                outputs[value.name] = dtype_name(str(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)))
            except (KeyError, ValueError, TypeError, ConfigError):
                outputs[value.name] = "float32"
    result = {
        name: DEFAULT_TOLERANCES.get(str(dtype), DEFAULT_TOLERANCES["float32"]) for name, dtype in outputs.items()
    }
    return {**result, **(overrides or {})}


RULE = (
    "An element passes when |got - ref| <= max(atol, rtol * |ref|) (it fails only beyond both; a non-finite "
    "reference must be matched exactly). A row's margin is the largest |got - ref| / max(atol, rtol * |ref|) over "
    "its elements: a row passes when its margin is at most 1."
)
"""The one rule of every posenc verdict, stated in every report."""


def margin_of(got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> float:
    """How much of its tolerance ``got`` uses against ``ref``: ``max |got - ref| / max(atol, rtol·|ref|)`` over the
    elements (finite references; ``inf`` where a non-finite one is not matched, 0 for no elements). At most 1
    exactly when :func:`outside_tolerance` finds no element."""
    got64, ref64 = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref64)
    same = (got64 == ref64) | (np.isnan(got64) & np.isnan(ref64))
    if not bool(same[~finite].all()):
        return float("inf")
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(got64 - ref64)[finite]
        allowed = np.maximum(tol.atol, tol.rtol * np.abs(ref64[finite]))
        ratio = np.where(allowed > 0, err / np.where(allowed > 0, allowed, 1.0), np.where(err > 0, np.inf, 0.0))
    ratio = np.where(np.isnan(ratio), np.inf, ratio)  # a NaN against a finite reference
    return float(ratio.max(initial=0.0))


def format_margin(margin: float | None) -> str:
    """A row's margin for a report cell: ``0.42``; ``—`` when the row has none (a report from before margins)."""
    return "—" if margin is None else f"{margin:.2f}"


def outside_tolerance(got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Boolean mask (shape of ``ref``) of the elements of ``got`` that fail ``tol`` against ``ref``.

    An element fails when ``|got - ref| > atol`` and ``|got - ref| > rtol * |ref|``, or when ``ref`` is not
    finite and ``got`` differs from it (NaN matches NaN). A NaN in ``got`` against a finite ``ref`` fails.
    """
    got64, ref64 = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref64)
    with np.errstate(invalid="ignore"):
        err = np.abs(got64 - ref64)
        inside = (err <= tol.atol) | (err <= tol.rtol * np.abs(ref64))
        same = (got64 == ref64) | (np.isnan(got64) & np.isnan(ref64))
    return np.where(finite, ~inside, ~same)
