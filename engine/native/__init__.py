"""Native CPU kernels built as an MLX extension (docs/native.md): the target's linears at the
bandwidth limit, quantized ones by default and float32 ones with DSPARK_NATIVE=1
(engine/native/linear.py). `scripts/build_native.sh` builds it; `scripts/bootstrap.sh` does so
when `build_is_current()` says the build is stale.

`load()` returns the extension module, or None with the reason in `REASON` (not built, built for
another MLX or nanobind ABI, or a CPU without AVX2, FMA and F16C), so callers can fall back cleanly.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import mlx.core as mx

from engine import backend

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


def kernel_threads() -> int:
    """Threads for a kernel call: the BLAS's, which the engine sets per phase (decode rounds may
    run at one thread, engine/costs.py)."""
    return backend.current_blas_threads() or 1


def load():
    """The `_native` extension module, or None (and `REASON` set) when it cannot be used here."""
    global REASON
    try:
        module = importlib.import_module("engine.native._native")
    except ImportError as exc:
        REASON = f"the native extension is not built (scripts/build_native.sh): {exc}"
        return None
    if not module.cpu_supported():
        REASON = "this CPU lacks AVX2, FMA or F16C, which the native kernel needs"
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


def pack_quantized(w: mx.array, scales: mx.array, biases: mx.array, bits: int, group_size: int):
    """An MLX affine-quantized weight (w [N, K * bits / 32] uint32, scales and biases [N, K / group_size])
    packed for `quantized_linear`: (codes [P, K * bits / 8, 16] uint8, scales [P, K / group_size, 16]
    float16, biases the same), panels of 16 outputs as in `pack_panels`, the last zero-padded.
    4-bit codes hold two consecutive k of one output a byte, the lower k in the low nibble.
    The scales and biases must be exactly representable in float16 (they are in GGUF files)."""
    n, words = w.shape
    per_word = 32 // bits
    shifts = mx.arange(per_word, dtype=mx.uint32) * bits
    codes = ((w[:, :, None] >> shifts) & (2**bits - 1)).reshape(n, words * per_word).astype(mx.uint8)  # [N, K]
    if bits == 4:
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)  # [N, K / 2]
    pad = -n % PANEL

    def panels(a: mx.array) -> mx.array:  # [N, C] -> [P, C, 16]
        if pad:
            a = mx.concatenate([a, mx.zeros((pad, a.shape[1]), dtype=a.dtype)])
        return mx.contiguous(a.reshape(-1, PANEL, a.shape[1]).transpose(0, 2, 1))

    return panels(codes), panels(scales.astype(mx.float16)), panels(biases.astype(mx.float16))


def quantized_rows(codes: mx.array, scales: mx.array, biases: mx.array, bits: int, group_size: int,
                   ids: mx.array) -> mx.array:
    """Rows `ids` [...] of the weight that `pack_quantized` packed, dequantized: [..., K] float32
    (w = s * q + b; the inverse of its layout, for an embedding held only as panels)."""
    panel, lane = ids // PANEL, ids % PANEL
    q = codes[panel, :, lane]  # [..., K * bits / 8] uint8
    if bits == 4:  # two k a byte, the lower k in the low nibble
        q = mx.stack([q & 15, q >> 4], axis=-1)
    s = scales[panel, :, lane].astype(mx.float32)[..., None]  # [..., K / group_size, 1]
    b = biases[panel, :, lane].astype(mx.float32)[..., None]
    w = q.reshape(*s.shape[:-1], group_size).astype(mx.float32) * s + b  # [..., K / group_size, group_size]
    return w.reshape(*ids.shape, -1)
