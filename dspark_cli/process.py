"""Process exit for commands that ran the engine's worker thread."""

from __future__ import annotations

import logging
import os
import sys


def exit_process(code: int) -> None:
    """Flush and exit without running C++ static destructors.

    MLX 0.32 can abort at interpreter exit ("terminate called without an active exception") once
    it has evaluated arrays on a non-main thread (ml-explore/mlx#3126), turning a clean shutdown
    into exit code 134. Processes that ran the worker thread call this after their own cleanup.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
