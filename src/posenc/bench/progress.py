"""A tiny progress printer (no dependency): a bar on terminals, one line per step elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts finished steps of a known total and shows ``[####----] 12/40  1m02s  what``.

    On a terminal the line is redrawn in place; into a file or pipe each step is one line, so logs stay
    readable. ``enabled=False`` prints nothing.
    """

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True, width: int = 24) -> None:
        self.total = max(int(total), 0)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self.started = time.monotonic()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_len = 0

    def _line(self, message: str) -> str:
        fraction = self.done / self.total if self.total else 1.0
        filled = round(fraction * self.width)
        elapsed = int(time.monotonic() - self.started)
        bar = "#" * filled + "-" * (self.width - filled)
        return f"[{bar}] {self.done}/{self.total} {elapsed // 60}m{elapsed % 60:02d}s  {message}"

    def step(self, message: str = "") -> None:
        """Mark one step finished and show ``message`` (what was just done)."""
        self.done = min(self.done + 1, self.total) if self.total else self.done + 1
        if self.enabled:
            self._write(message)

    def show(self, message: str) -> None:
        """Show ``message`` without counting a step (what is being prepared); terminals only."""
        if self.enabled and self._tty:
            self._write(message)

    def _write(self, message: str) -> None:
        line = self._line(message)
        if self._tty:
            pad = max(self._last_len - len(line), 0)
            self.stream.write("\r" + line + " " * pad)
            self._last_len = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line on a terminal."""
        if self.enabled and self._tty and self._last_len:
            self.stream.write("\n")
            self.stream.flush()
            self._last_len = 0
