"""The preallocated KV cache write: one torch operator (``posenc::write_cache``) an export keeps whole.

Shape legend: ``B`` batch, ``Hkv`` kv heads, ``C`` cache slots, ``S`` new tokens, ``D`` head dim.
"""

from __future__ import annotations

import torch

from posenc.errors import ConfigError
from posenc.functional.guard import is_tracing


@torch.library.custom_op("posenc::write_cache", mutates_args=())
def _write_cache(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor) -> torch.Tensor:
    index = past_length.to(torch.int64)[:, None] + torch.arange(new.shape[2], device=new.device)  # [B, S]
    return cache.clone().scatter_(2, index[:, None, :, None].expand(new.shape), new.to(cache.dtype))


@_write_cache.register_fake
def _write_cache_shape(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(cache)


@torch.library.custom_op("posenc::write_ring", mutates_args=())
def _write_ring(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor) -> torch.Tensor:
    index = past_length.to(torch.int64)[:, None] + torch.arange(new.shape[2], device=new.device)  # [B, S]
    index = index % cache.shape[2]
    return cache.clone().scatter_(2, index[:, None, :, None].expand(new.shape), new.to(cache.dtype))


@_write_ring.register_fake
def _write_ring_shape(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(cache)


def write_cache(cache: torch.Tensor, new: torch.Tensor, past_length: torch.Tensor, ring: bool = False) -> torch.Tensor:
    """A preallocated cache with ``new`` written at slots ``past_length[b] .. past_length[b] + S - 1`` of each row
    (``ring``: at those slots modulo ``C``, a ring buffer).

    One torch operator (``posenc::write_cache``, ``posenc::write_ring``), so that an export keeps it whole:
    posenc's exporter writes it as ONNX ``TensorScatter`` (opset 24, ``axis=2``, ``linear`` mode, or ``circular``
    for a ring), which runtimes execute in place when the output is bound to the input's buffer. The eager result
    is a new tensor (the input is not modified).

    Args:
        cache: ``[B, Hkv, C, D]``, ``C`` slots per row.
        new: ``[B, Hkv, S, D]`` (cast to the cache's dtype).
        past_length: int ``[B]``, the tokens already written in each row (more than ``C`` in a ring).
        ring: write at ``(past_length + i) mod C`` (a window-sized cache of a sliding-window layer); ``S <= C``.

    Returns:
        ``[B, Hkv, C, D]``.

    Raises:
        ConfigError: shapes that do not fit, a non-integer ``past_length``, or (eager only) a write past the last
            slot or at a negative one.
    """
    if past_length.dtype.is_floating_point or past_length.dtype == torch.bool:
        raise ConfigError(f"past_length must be an integer tensor (int64), got {past_length.dtype}.")
    if cache.dim() != 4 or new.dim() != 4 or past_length.dim() != 1:
        raise ConfigError(
            f"write_cache takes cache [B, Hkv, C, D], new [B, Hkv, S, D] and past_length [B]; got shapes "
            f"{list(cache.shape)}, {list(new.shape)} and {list(past_length.shape)}."
        )
    if not is_tracing():
        b, hkv, slots, d = cache.shape
        if (new.shape[0], new.shape[1], new.shape[3]) != (b, hkv, d) or past_length.shape[0] != b:
            raise ConfigError(
                f"new {list(new.shape)} and past_length {list(past_length.shape)} do not fit the cache "
                f"{list(cache.shape)}: batch, kv heads and head dim must agree."
            )
        if ring and (new.shape[2] > slots or (past_length.numel() and int(past_length.min()) < 0)):
            raise ConfigError(
                f"{new.shape[2]} new tokens at past_length {past_length.tolist()} do not fit a ring cache of {slots} "
                f"slots: a ring takes at most C new tokens per call at a past_length >= 0; feed fewer at a time."
            )
        linear_overflow = past_length.numel() and int(past_length.max()) + new.shape[2] > slots
        if not ring and past_length.numel() and (int(past_length.min()) < 0 or linear_overflow):
            raise ConfigError(
                f"past_length {past_length.tolist()} + {new.shape[2]} new tokens do not fit a cache of {slots} "
                f"slots; allocate a longer cache (past_length + S <= C)."
            )
    return (_write_ring if ring else _write_cache)(cache, new, past_length)
