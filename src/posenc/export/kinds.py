"""The names of the export units and cache layouts (strings only, no torch: the command line reads them).

:mod:`posenc.export.units` describes what each unit's graph takes and returns.
"""

from __future__ import annotations

from posenc.errors import ExportError

UNITS: tuple[str, ...] = ("op", "op-3d", "block")
"""The units a user names (``--unit``); the block's cache layout is chosen apart (``--kv-cache``)."""
BLOCK_INPLACE = "block-inplace"
"""The block over a preallocated, in-place cache (``--unit block --kv-cache inplace``)."""
ALL_UNITS: tuple[str, ...] = (*UNITS, BLOCK_INPLACE)
KV_CACHES: tuple[str, ...] = ("concat", "inplace")
"""Cache layouts of an exported block: ``concat`` (past in, past + new out) and ``inplace`` (preallocated)."""


def unit_for_cache(unit: str, kv_cache: str) -> str:
    """The export unit of ``unit`` with cache layout ``kv_cache``: ``("block", "inplace")`` -> ``block-inplace``.

    Raises:
        ExportError: an unknown layout, or ``inplace`` for a unit without a cache.
    """
    if kv_cache not in KV_CACHES:
        raise ExportError(f"unknown kv cache layout {kv_cache!r}; use one of {list(KV_CACHES)}.")
    if kv_cache == "concat":
        return unit
    if unit not in ("block", BLOCK_INPLACE):
        raise ExportError(f"--kv-cache inplace is a layout of the block's cache; unit {unit!r} has no cache.")
    return BLOCK_INPLACE
