"""Progress lines on stderr for long one-time work (downloads, conversion)."""

from __future__ import annotations

import sys
import time

_START = time.monotonic()


def stderr_progress(message: str) -> None:
    """Print one timestamped progress line to stderr."""
    print(f"[dspark {time.monotonic() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)


class ProgressBar:
    """A counted progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, label: str, stream=None, width: int = 24):
        self.total, self.label, self.width = max(1, total), label, width
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self._t0 = time.monotonic()

    def advance(self, note: str = "") -> None:
        """One step done; `note` says which."""
        self.done += 1
        frac = min(1.0, self.done / self.total)
        elapsed = time.monotonic() - self._t0
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        bar = "#" * round(frac * self.width) + "." * (self.width - round(frac * self.width))
        line = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.0f}s eta {eta:4.0f}s {note}"
        self.stream.write(f"\r\033[K{line}" if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the in-place line."""
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
