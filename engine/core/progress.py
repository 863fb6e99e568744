"""A dependency-free terminal progress bar for ``python -m engine run``."""
from __future__ import annotations

import sys
import time


class TerminalProgress:
    """Callable ``(fraction, message)`` that redraws one line on stderr (one line per message when piped)."""

    def __init__(self, width: int = 30, stream=None):
        self.width, self.stream, self.start = width, stream or sys.stderr, time.perf_counter()
        self.tty = self.stream.isatty()
        self.last = ""

    def __call__(self, fraction: float, message: str) -> None:
        fraction = max(0.0, min(1.0, fraction))
        filled = int(self.width * fraction)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {100 * fraction:5.1f}% {time.perf_counter() - self.start:5.0f}s  {message}"
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(len(self.last)))
            self.last = line[:150]
        elif message != self.last:
            self.stream.write(line + "\n")
            self.last = message
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
