"""Native CPU kernels built as an MLX extension (docs/native.md): the target's linears at the
bandwidth limit, used with DSPARK_NATIVE=1 (engine/native/linear.py). `scripts/build_native.sh`
builds it; `scripts/bootstrap.sh` does so when `build_is_current()` says the build is stale.

`load()` returns the extension module, or None with the reason in `REASON` (not built, built for
another MLX or nanobind ABI, or a CPU without AVX2 and FMA), so callers can fall back cleanly.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import mlx.core as mx

PANEL = 16  # outputs per panel of a packed weight (panel.inc)

REASON: str | None = None
HERE = Path(__file__).parent
STAMP = HERE / ".dspark-built"  # the source_stamp() of the build in place (written by bootstrap)
SOURCES = ("*.cpp", "*.inc", "*.h", "CMakeLists.txt")


def source_stamp() -> str:
    """A hash of the extension's sources and of MLX's version: what a build in place must match."""
    digest = hashlib.sha256()
    for pattern in SOURCES:
        for path in sorted(HERE.glob(pattern)):
            digest.update(path.read_bytes())
    digest.update(mx.__version__.encode())
    return digest.hexdigest()


def build_is_current() -> bool:
    """True when the built module in place was built from these sources for this MLX."""
    built = STAMP.read_text().strip() if STAMP.exists() else None
    return built == source_stamp() and any(HERE.glob("_native*.so"))


def write_stamp() -> None:
    """Record that the module in place was just built from these sources for this MLX."""
    STAMP.write_text(source_stamp() + "\n")


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
