"""torch.onnx's ATen -> ONNX registry, built once per process and opset instead of once per export.

``torch.onnx.export(dynamo=True)`` (torch 2.13) rebuilds its registry from torchlib on every call
(``ONNXRegistry.from_torchlib``: about 0.25 s, a tenth of a small block's export and of posenc's test suite), then
registers the call's own translations into it. The registry depends only on the installed torch and onnxscript.

:func:`reused_translation_registry` builds it once per opset and hands every export a copy (new per-op lists), so
posenc's translations never reach the kept one. The graphs are the same (tests/export/test_onnx_registry.py
compares graphs exported with and without it). Where torch's internals are not the ones named here, the context
does nothing and every export builds its own registry, as torch does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_LOCK = threading.RLock()
_DEPTH = 0
_KEPT: dict[int, Any] = {}
"""opset -> the registry torchlib gives for it (never handed out: exports get copies)."""
_ORIGINAL: list[Any] = []
"""the ``from_torchlib`` classmethod while the context is active."""


def _registry_class() -> Any:
    """torch.onnx's ``ONNXRegistry``, or None where it is not the class this module knows."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return None
    registry = getattr(_registration, "ONNXRegistry", None)
    if registry is None or not isinstance(registry.__dict__.get("from_torchlib"), classmethod):
        return None
    if not isinstance(getattr(registry(), "functions", None), dict):
        return None
    return registry


def _copied_registry(cls: Any, opset_version: int | None = None) -> Any:
    """``ONNXRegistry.from_torchlib``, built once per opset: a new registry whose per-op lists are copies."""
    opset = opset_version if opset_version is not None else cls()._opset_version
    with _LOCK:
        kept = _KEPT.get(opset)
        if kept is None:
            kept = _KEPT[opset] = _ORIGINAL[0].__func__(cls, opset_version=opset)
    copy = cls()
    copy._opset_version = kept._opset_version
    copy.functions = {target: list(metas) for target, metas in kept.functions.items()}
    return copy


@contextlib.contextmanager
def reused_translation_registry() -> Iterator[None]:
    """Within this context ``torch.onnx.export`` copies a per-process torchlib registry instead of building one
    (nested and concurrent uses share one patch; the last to leave restores torch's classmethod)."""
    global _DEPTH
    registry_class = _registry_class()
    if registry_class is None:
        yield
        return
    with _LOCK:
        if _DEPTH == 0:
            _ORIGINAL.append(registry_class.__dict__["from_torchlib"])
            registry_class.from_torchlib = classmethod(_copied_registry)
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                registry_class.from_torchlib = _ORIGINAL.pop()
