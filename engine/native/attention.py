"""Causal attention over a prompt chunk through the native softmax (docs/native.md, "Prefill").

MLX's CPU softmax computes exp one element at a time, and a prompt chunk's scores are
[heads, rows, keys]: at a few thousand tokens of context that loop is most of the prefill. For a
routed target (`route_attention`, at load beside its linears), attention over forwards of at least
MIN_ROWS rows with the causal mask becomes two BLAS matmuls around `causal_softmax`. Smaller
forwards (decode steps and verify rounds) keep MLX's attention, so every round computes exactly
what it did before; a prompt is read in the same chunks in every mode, so modes still agree.

mlx-lm's attention layers call their module's `scaled_dot_product_attention`; routing replaces
that name in the model's modules with a function that uses the kernel only while a routed model's
forward runs on this thread (`active`), and calls the original otherwise.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

from engine import backend

# Rows a forward needs before its attention takes the kernel: above any verify round (a cap of at
# most 16 drafts plus the anchor), so only prompt chunks do.
MIN_ROWS = 64
_MARK = "_dspark_native_attention"
_state = threading.local()


def causal_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, ext) -> mx.array:
    """softmax(q k^T * scale, causal) v for queries [B, H, L, D] at the last L of keys and values
    [B, Hkv, S, D] (H a multiple of Hkv: query head h reads key head h // (H / Hkv)); [B, H, L, D]."""
    b, h, rows, d = queries.shape
    kv_heads, s = keys.shape[1], keys.shape[2]
    grouped = (queries * scale).reshape(b, kv_heads, (h // kv_heads) * rows, d)  # [B, Hkv, rep*L, D]
    scores = (grouped @ keys.swapaxes(-1, -2)).reshape(b, kv_heads, h // kv_heads, rows, s)  # [B, Hkv, rep, L, S]
    weights = ext.causal_softmax(scores, s - rows, backend.current_blas_threads() or 1)
    return (weights.reshape(b, kv_heads, -1, s) @ values).reshape(b, h, rows, -1)


def route_attention(model: nn.Module, ext) -> int:
    """Give `model`'s mlx-lm attention layers the kernel for prompt chunks: returns how many layers'
    modules now call through `_routed` (0 when the model's attention is not mlx-lm's)."""
    patched = 0
    for _, module in model.named_modules():
        source = sys.modules.get(type(module).__module__)
        original = getattr(source, "scaled_dot_product_attention", None)
        if original is None or not hasattr(module, "scale"):
            continue
        if not getattr(original, _MARK, False):
            source.scaled_dot_product_attention = _routed(original, ext)
        patched += 1
    setattr(model, _MARK, patched > 0)
    return patched


@contextmanager
def active(model) -> Iterator[None]:
    """While this runs, attention of prompt chunks on this thread takes the kernel if `model` was
    routed (`route_attention`); other models and threads keep MLX's attention."""
    before = getattr(_state, "on", False)
    _state.on = getattr(model, _MARK, False)
    try:
        yield
    finally:
        _state.on = before


def _routed(original, ext):
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None, **kwargs):
        if (getattr(_state, "on", False) and isinstance(mask, str) and mask == "causal" and sinks is None
                and not kwargs and not hasattr(cache, "bits") and queries.shape[2] >= MIN_ROWS
                and queries.dtype == keys.dtype == values.dtype == mx.float32
                and queries.shape[1] % keys.shape[1] == 0):
            return causal_attention(queries, keys, values, scale, ext)
        return original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks, **kwargs)

    setattr(scaled_dot_product_attention, _MARK, True)
    return scaled_dot_product_attention
