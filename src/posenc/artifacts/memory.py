"""Sizes checked against memory before anything is allocated: a refusal names the bytes and what to change.

posenc estimates what a request allocates (position tables of ``max_positions`` rows, the projection weights of a
geometry, the activations of a call at a shape) and refuses it with :class:`~posenc.errors.ConfigError` when it
exceeds the memory this machine has available, instead of attempting an allocation that fails deep inside torch
(or takes the machine down). The estimates are upper bounds of the dominant allocations, not exact accounting.
"""

from __future__ import annotations

import os

from posenc.errors import ConfigError

__all__ = ["attention_call_bytes", "available_bytes", "check_bytes", "human_bytes"]


def human_bytes(size: float) -> str:
    """``1.5 GiB``, ``800.0 MiB``, ``12 B``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


def available_bytes() -> int:
    """Memory this process may still allocate: ``MemAvailable`` (Linux), else physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 40


def check_bytes(nbytes: int, what: str, remedy: str) -> None:
    """Refuse ``nbytes`` for ``what`` when this machine cannot hold it.

    Raises:
        ConfigError: names the bytes needed, the bytes available and ``remedy``.
    """
    available = available_bytes()
    if nbytes > available:
        raise ConfigError(
            f"{what} would need {human_bytes(nbytes)} ({nbytes:,} bytes) of memory, more than the "
            f"{human_bytes(available)} available here; {remedy}"
        )


def attention_call_bytes(
    batch: int, seq: int, past: int, hidden: int, heads: int, kv_heads: int, head_dim: int, itemsize: int = 8
) -> int:
    """Upper bound of the activations of one attention-block call (inputs, q/k/v, caches, scores and softmax),
    each element ``itemsize`` bytes (8: the float64 reference)."""
    keys = past + seq
    elements = (
        2 * batch * seq * hidden  # hidden in and out
        + batch * heads * seq * head_dim  # q
        + 4 * batch * kv_heads * keys * head_dim  # past and present keys and values
        + 3 * batch * heads * seq * keys  # scores, mask, probabilities
    )
    return elements * itemsize
