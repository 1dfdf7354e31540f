"""The before/after check of ``posenc optimize``: the optimized graph against the graph it came from, on ONNX
Runtime CPU, through the one comparison path (:func:`posenc.validate.compare.compare`).

:func:`posenc.graphs.optimize_file` takes it as its ``check`` argument from its callers (the CLI), because the graph
layer sits below ``posenc.validate`` and does not import it.
"""

from __future__ import annotations

from typing import Any

from posenc.errors import ParityError
from posenc.export.manifest import OutputDrift
from posenc.export.units import BLOCK_INPLACE
from posenc.validate.compare import Reference, compare


def check_ort_parity(before: bytes, after: bytes, info: Any) -> dict[str, OutputDrift]:
    """Run both serialized models on ONNX Runtime CPU with one feed; raise if an output moved.

    The graph before optimization is the reference, the optimized graph the candidate; the feed is
    :data:`~posenc.validate.feeds.OPTIMIZE_CHECK_SHAPE` fitted to a short table (manifest feed, else random
    of the graph's inputs); bf16 graphs run emulated; tolerances follow the manifest's scheme per output
    dtype (the dtype defaults of :data:`posenc.schemes.DEFAULT_TOLERANCES` without a manifest).

    Args:
        before, after: the serialized models.
        info: :class:`posenc.graphs.manifests.ModelInfo` of the source file (its manifest, if any).

    Returns:
        ``{output name: OutputDrift}``.

    Raises:
        ParityError: an output moved outside its tolerance, or ONNX Runtime cannot run one of the graphs
            (use ``--no-parity`` and validate on the target).
    """
    from posenc.validate.bf16 import load_proto, prepare_for_ort
    from posenc.validate.feeds import OPTIMIZE_CHECK_SHAPE, fit_shapes, model_feeds
    from posenc.validate.runners import ort_runner
    from posenc.validate.tolerance import tolerances_of

    manifest = info.manifest
    proto = load_proto(before)
    shapes = fit_shapes([OPTIMIZE_CHECK_SHAPE], manifest.max_positions if manifest is not None else None)
    feeds = model_feeds(shapes, manifest=manifest, model=proto)
    tols = tolerances_of(manifest, proto)
    in_place = manifest is not None and manifest.unit == BLOCK_INPLACE  # presents share their caches' buffers
    try:
        prepared = [prepare_for_ort(model, feeds) for model in (before, after)]
        runners = [
            ort_runner(p.model, name=n, in_place=in_place) for p, n in zip(prepared, ("before", "after"), strict=True)
        ]
        reference = Reference(runners[0], "the graph before optimization, ORT CPU")
        comparison = compare([reference], [runners[1]], prepared[0].feeds, tols)
    except Exception as exc:  # onnxruntime and polygraphy raise their own exception types
        raise ParityError(
            f"ONNX Runtime CPU could not run the graph before/after optimization ({type(exc).__name__}: "
            f"{str(exc)[:300]}); nothing was written. Optimize with --no-parity and validate on the target."
        ) from None
    expected, got = comparison.outputs("before"), comparison.outputs("after")
    report: dict[str, OutputDrift] = {}
    for row in comparison.rows:
        if row.output not in got or got[row.output].shape != expected[row.output].shape:
            found = got[row.output].shape if row.output in got else "nothing"
            raise ParityError(
                f"output {row.output!r} changed shape {expected[row.output].shape} -> {found}; this is a pass bug."
            )
        report[row.output] = OutputDrift(max_abs_diff=row.max_abs, atol=row.atol, rtol=row.rtol)
        if not row.passed:
            raise ParityError(
                f"output {row.output!r} of the optimized graph differs from the original by {row.max_abs:.3g} "
                f"(tolerance atol={row.atol:g}, rtol={row.rtol:g}) on ONNX Runtime CPU; nothing was written. "
                f"Use --rope keep to skip the RoPE fusion, and report the graph."
            )
    return report


__all__ = ["check_ort_parity"]
