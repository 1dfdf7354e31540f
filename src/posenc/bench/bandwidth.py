"""The machine's copy bandwidth: the roofline a memory-bound op is compared with.

A large array is copied with numpy (one thread, ``np.copyto``); read and written bytes both count, so the
figure is directly comparable with "inputs read + outputs written" of an op. The median of several copies
after a warm-up copy is reported. Measure it in the same run as the latencies: shared machines drift.
"""

from __future__ import annotations

import dataclasses
import time
from typing import ClassVar

import numpy as np

from posenc.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class CopyBandwidth:
    """Measured copy bandwidth.

    Attributes:
        bytes_per_s: median of ``2 * nbytes / seconds`` (read + write counted).
        mib: size of the copied array in MiB.
        repeats: timed copies.
        samples: every timed copy's bandwidth, bytes/s.
    """

    bytes_per_s: float
    mib: int
    repeats: int
    samples: tuple[float, ...]

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("gb_per_s",)

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9


def measure_copy_bandwidth(mib: int = 1024, repeats: int = 5) -> CopyBandwidth:
    """Copy a ``mib`` MiB float32 array ``repeats`` times (after one warm-up copy) and take the median.

    Args:
        mib: array size in MiB; 1024 (1 GiB) escapes every cache of a server CPU. Small sizes mostly
            measure caches and give numbers that are not a DRAM roofline.
        repeats: timed copies (>= 1).

    Raises:
        ConfigError: ``mib`` or ``repeats`` is not a positive int.
    """
    for name, value in (("mib", mib), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"copy bandwidth {name} must be a positive int, got {value!r}.")
    count = mib * (1 << 20) // 4
    source = np.ones(count, dtype=np.float32)
    target = np.empty_like(source)
    np.copyto(target, source)  # warm-up: page faults of the target happen here
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        np.copyto(target, source)
        samples.append(2 * source.nbytes / (time.perf_counter() - begin))
    return CopyBandwidth(float(np.median(samples)), mib, repeats, tuple(samples))


class CopyRunner:
    """A zero-argument callable that copies ``mib`` MiB once (for timing alongside an op).

    ``bytes_per_call`` counts read and write, like :func:`measure_copy_bandwidth`.
    """

    def __init__(self, mib: int) -> None:
        count = mib * (1 << 20) // 4
        self.source = np.ones(count, dtype=np.float32)
        self.target = np.empty_like(self.source)
        np.copyto(self.target, self.source)  # page faults happen here, not in a timed call
        self.bytes_per_call = 2 * self.source.nbytes

    def __call__(self) -> None:
        np.copyto(self.target, self.source)
