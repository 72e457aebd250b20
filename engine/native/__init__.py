"""Native CPU kernels built as an MLX extension (docs/native.md): a prototype of the verify path
at the bandwidth limit. The engine does not call it yet; `scripts/build_native.sh` builds it.

`load()` returns the extension module, or None with the reason in `REASON` (not built, built for
another MLX or nanobind ABI, or a CPU without AVX2 and FMA), so callers can fall back cleanly.
"""

from __future__ import annotations

import importlib

REASON: str | None = None


def load():
    """The `_native` extension module, or None (and `REASON` set) when it cannot be used here."""
    global REASON
    try:
        module = importlib.import_module("engine.native._native")
    except ImportError as exc:
        REASON = f"the native extension is not built (scripts/build_native.sh): {exc}"
        return None
    if not module.cpu_supported():
        REASON = "this CPU lacks AVX2 and FMA, which the native kernel needs"
        return None
    REASON = None
    return module
