"""Progress lines on stderr for long one-time work (downloads, conversion)."""

from __future__ import annotations

import sys
import time

_START = time.monotonic()


def stderr_progress(message: str) -> None:
    """Print one timestamped progress line to stderr."""
    print(f"[dspark {time.monotonic() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)
