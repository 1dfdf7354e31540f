"""Tracing and the in-graph position guard: :func:`is_tracing` and :func:`position_guard`.

Shape legend: ``B`` batch, ``S`` sequence.
"""

from __future__ import annotations

import torch


def is_tracing() -> bool:
    """True while torch traces, exports or compiles (eager-only checks must step aside then)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return True
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    if is_exporting is not None and is_exporting():
        return True
    return bool(torch.onnx.is_in_onnx_export())


def position_guard(position_ids: torch.Tensor, limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The in-graph guard of exported tables: safe indices, and a poison that is 0 or NaN per position.

    A position is valid when ``0 <= p < limit`` (``limit`` None: ``p >= 0``). The guard returns

    - ``safe``: the position ids with every invalid one replaced by 0, so that every table lookup stays in
      bounds on every runtime (TensorRT reads out-of-range gathers as zeros or worse);
    - ``poison`` ``[*position_ids.shape]`` float32: 0 where valid, NaN where not, read through a one-row
      tripwire table at row ``int(not valid)``: ONNX Runtime refuses the out-of-range row with an error
      ("indices element out of data bounds"), a runtime that cannot raise (TensorRT) yields the NaN.

    Callers add ``poison`` to what the positions produced (rotated q/k, embeddings, biases), so an invalid
    position can never give a finite, plausible number. Eager code checks positions with
    :class:`~posenc.errors.PositionError` instead; this is for graphs (it is traced, not run eagerly).

    Args:
        position_ids: int64 ``[...]``.
        limit: exclusive upper bound (rows of the precomputed table), or None.
    """
    valid = position_ids >= 0
    if limit is not None:
        valid = valid & (position_ids < limit)
    safe = torch.where(valid, position_ids, 0)  # scalar constants: no Shape/Expand nodes in the graph
    tripwire = torch.zeros(1, 1, dtype=torch.float32, device=position_ids.device)
    row = torch.where(valid, 0, 1)
    trip = torch.nn.functional.embedding(row, tripwire).squeeze(-1)
    poison = torch.where(valid, trip, float("nan"))
    return safe, poison
