"""The traced path: any checkpoint's attention layer, exported as its model calls it, with posenc's tables.

Public API::

    from posenc.trace import capture_layer, TracedAttention

    captured = capture_layer("path/to/checkpoint", layer=3)   # how the model calls layer 3's attention
    module = traced_module(captured)                           # hidden, position_ids, past -> out, presents

See :mod:`posenc.trace.capture` (the capture), :mod:`posenc.trace.module` (the unit),
:mod:`posenc.trace.layouts` (how a model lays out cos/sin) and :mod:`posenc.trace.record` (what the manifest
records). The export is :func:`posenc.export.trace.export_traced`; the graph pass that replaces the traced angles
with posenc's tables is :mod:`posenc.graphs.trace_rewrite`.
"""

from posenc._lazy import lazy_exports

_EXPORTS = {
    "Captured": "posenc.trace.capture",
    "TraceRecord": "posenc.trace.record",
    "TracedAttention": "posenc.trace.module",
    "capture_layer": "posenc.trace.capture",
    "traced_module": "posenc.trace.build",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
