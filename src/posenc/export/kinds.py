"""The export units and cache layouts (no torch: the command line reads them).

:class:`UnitKind` is what one graph holds; a name given on the command line or to the API is parsed into one
once (:meth:`UnitKind.parse`), and manifests record its value (``"op"``, ``"op-3d"``, ``"block"``,
``"block-inplace"``). :mod:`posenc.export.units` describes what each unit's graph takes and returns.
"""

from __future__ import annotations

import enum

from posenc.errors import ExportError


class UnitKind(enum.StrEnum):
    """What one exported graph holds (a ``str`` whose value the manifest records).

    ``OP``: the scheme's positional op; ``OP_3D``: a rotary op on the projection layout ``[B, S, H*D]``;
    ``BLOCK``: the attention block with a concatenated cache; ``BLOCK_INPLACE``: the block over a preallocated
    cache written in place (opset 24).
    """

    OP = "op"
    OP_3D = "op-3d"
    BLOCK = "block"
    BLOCK_INPLACE = "block-inplace"

    @classmethod
    def parse(cls, unit: UnitKind | str, kv_cache: str = "concat") -> UnitKind:
        """The unit named ``unit`` with the cache layout ``kv_cache``: ``("block", "inplace")`` -> ``BLOCK_INPLACE``.

        Raises:
            ExportError: an unknown unit or layout, or ``inplace`` for a unit without a cache.
        """
        if isinstance(unit, cls):
            kind = unit
        elif isinstance(unit, str) and unit in ALL_UNITS:
            kind = cls(unit)
        else:
            raise ExportError(f"unknown export unit {unit!r}; use one of {list(ALL_UNITS)}.")
        if kv_cache not in KV_CACHES:
            raise ExportError(f"unknown kv cache layout {kv_cache!r}; use one of {list(KV_CACHES)}.")
        if kv_cache == "concat":
            return kind
        if not kind.is_block:
            raise ExportError(f"--kv-cache inplace is a layout of the block's cache; unit {kind.value!r} has no cache.")
        return cls.BLOCK_INPLACE

    @property
    def is_block(self) -> bool:
        """A whole attention block (either cache layout), not a positional op."""
        return self in (UnitKind.BLOCK, UnitKind.BLOCK_INPLACE)

    @property
    def export_name(self) -> str:
        """``"op"`` or ``"block"``: what :attr:`posenc.schemes.SchemeSpec.exports` lists for this unit."""
        return "block" if self.is_block else "op"


UNITS: tuple[str, ...] = (UnitKind.OP.value, UnitKind.OP_3D.value, UnitKind.BLOCK.value)
"""The units a user names (``--unit``); the block's cache layout is chosen apart (``--kv-cache``)."""
BLOCK_INPLACE = UnitKind.BLOCK_INPLACE
"""The block over a preallocated, in-place cache (``--unit block --kv-cache inplace``); equal to its string."""
ALL_UNITS: tuple[str, ...] = tuple(kind.value for kind in UnitKind)
KV_CACHES: tuple[str, ...] = ("concat", "inplace")
"""Cache layouts of an exported block: ``concat`` (past in, past + new out) and ``inplace`` (preallocated)."""


__all__ = ["ALL_UNITS", "BLOCK_INPLACE", "KV_CACHES", "UNITS", "UnitKind"]
