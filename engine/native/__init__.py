"""Native CPU kernels built as an MLX extension (docs/native.md): a prototype of the verify path
at the bandwidth limit. The engine does not call it yet; `scripts/build_native.sh` builds it.

`load()` returns the extension module, or None with the reason in `REASON` (not built, built for
another MLX or nanobind ABI, or a CPU without AVX2 and FMA), so callers can fall back cleanly.
"""

from __future__ import annotations

import importlib

import mlx.core as mx

PANEL = 16  # outputs per panel of a packed weight (panel.inc)

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


def pack_panels(w: mx.array) -> mx.array:
    """w [N, K] float32 packed for `packed_linear`: wp [P, K, 16] with wp[p, k, j] = w[16 p + j, k]
    (P = ceil(N / 16); the last panel is zero-padded). Same bytes as w, laid out so that the kernel
    reads each panel as one sequential stream."""
    n, k = w.shape
    pad = -n % PANEL
    if pad:
        w = mx.concatenate([w, mx.zeros((pad, k), dtype=w.dtype)])
    return mx.contiguous(w.reshape(-1, PANEL, k).transpose(0, 2, 1))  # [P, K, 16]
