"""Process-wide settings of posenc's batch entry points (the command line, census and demo workers).

A posenc command holds millions of long-lived objects (torch, transformers, onnxscript and torch.export's caches),
over which CPython's default collector thresholds ``(700, 10, 10)`` run a full collection every few seconds (about
0.6 s each in a test worker, 15 % of its time; a census worker runs 10 % faster with these thresholds:
docs/performance.md, "Start-up and the test suite"). Young collections still run, so short-lived cycles are freed.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

BATCH_GC_THRESHOLDS = (50_000, 20, 20)
"""``gc.set_threshold`` for a batch job: a young collection per 50,000 allocations, an older one per 20 of those."""


def use_batch_gc() -> tuple[int, int, int]:
    """:data:`BATCH_GC_THRESHOLDS` from now on (a process that only runs batch jobs: a pool or test worker); returns
    the thresholds before."""
    previous = gc.get_threshold()
    gc.set_threshold(*BATCH_GC_THRESHOLDS)
    return previous


@contextlib.contextmanager
def batch_gc() -> Iterator[None]:
    """:data:`BATCH_GC_THRESHOLDS` for the duration of the context; the previous thresholds restored after."""
    previous = use_batch_gc()
    try:
        yield
    finally:
        gc.set_threshold(*previous)
