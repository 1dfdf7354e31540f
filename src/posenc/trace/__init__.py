"""The traced path: any checkpoint's attention layer, exported as its model calls it, with posenc's tables.

Public API::

    from posenc.trace import capture_layer, plan_trace, traced_module, load_traced

    plan = plan_trace(capture_layer("path/to/checkpoint", layer=3))   # how the model calls layer 3's attention
    module = traced_module(plan)                      # hidden, position_ids, past -> out, presents (the model's angles)
    exact = traced_module(plan, angles="exact")       # the same with posenc's cos/sin, where they are the model's
    layer = load_traced("path/to/checkpoint", 3)      # plan, provenance and references for validate --against-hf

See :mod:`posenc.trace.capture` (the capture), :mod:`posenc.trace.build` (plan and unit), :mod:`posenc.trace.module`
(the unit's forward), :mod:`posenc.trace.layouts` (how a model lays out cos/sin) and :mod:`posenc.trace.record`
(what the manifest records). The export is :func:`posenc.export.trace.export_traced`; the graph pass that replaces
the traced angles with posenc's tables is :mod:`posenc.graphs.trace_rewrite`.
"""

from posenc._lazy import lazy_exports

_EXPORTS = {
    "Captured": "posenc.trace.capture",
    "TraceRecord": "posenc.trace.record",
    "TracedAttention": "posenc.trace.module",
    "TracePlan": "posenc.trace.build",
    "capture_layer": "posenc.trace.capture",
    "load_traced": "posenc.trace.reference",
    "plan_trace": "posenc.trace.build",
    "traced_module": "posenc.trace.build",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
