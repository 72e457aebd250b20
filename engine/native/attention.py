"""Attention through the native kernels for a routed target (docs/native.md, "Attention").

MLX's CPU softmax computes exp one element at a time, and its attention for a few query rows is a
chain of small ops. For a routed target (`route_attention`, at load beside its linears):

- a forward of at least MIN_ROWS rows (a prompt chunk) with the causal mask: two BLAS matmuls
  around `causal_softmax`;
- any smaller forward (a decode step, a verify round): `few_row_attention`, one call a layer that
  computes each query row alone over the keys it sees, so a row verified beside others equals the
  same row decoded alone, as with the linears.

A prompt is read in the same chunks in every mode, so modes agree as before. mlx-lm's attention
layers call their module's `scaled_dot_product_attention` (mlx-lm's own, from its `base`); routing
replaces that name in those modules with a function that takes the kernels only while a routed
model's forward runs on this thread (`active`), and calls mlx-lm's otherwise.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base as mlx_lm_base

from engine import native

# Rows from which a forward's attention is BLAS products around the softmax kernel rather than
# few_row_attention: above any verify round (a cap of at most 16 drafts plus the anchor), so that
# decode steps and rounds always share one kernel.
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
    weights = ext.causal_softmax(scores, s - rows, native.kernel_threads())
    return (weights.reshape(b, kv_heads, -1, s) @ values).reshape(b, h, rows, -1)


def route_attention(model: nn.Module, ext) -> int:
    """Give `model`'s mlx-lm attention layers the kernels: returns how many attention modules now
    call through `_routed` (0 when the model's attention is not mlx-lm's)."""
    patched = 0
    for _, module in model.named_modules():
        source = sys.modules.get(type(module).__module__)
        current = getattr(source, "scaled_dot_product_attention", None)
        if current is None or not hasattr(module, "scale"):
            continue
        if current is mlx_lm_base.scaled_dot_product_attention:
            source.scaled_dot_product_attention = _routed(current, ext)
        elif not getattr(current, _MARK, False):
            continue  # another library's attention, whose call we do not know
        patched += 1
    setattr(model, _MARK, patched > 0)
    return patched


@contextmanager
def active(model) -> Iterator[None]:
    """While this runs, attention on this thread takes the kernels if `model` was routed
    (`route_attention`); other models and threads keep MLX's attention."""
    before = getattr(_state, "on", False)
    _state.on = getattr(model, _MARK, False)
    try:
        yield
    finally:
        _state.on = before


def routed_here() -> bool:
    """Whether a routed model's forward runs on this thread now (inside `active`)."""
    return getattr(_state, "on", False)


def _routed(original, ext):
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None, **kwargs):
        rows = queries.shape[2]
        causal = (isinstance(mask, str) and mask == "causal") or (mask is None and rows == 1)
        if (routed_here() and causal and sinks is None and not kwargs and not hasattr(cache, "bits")
                and queries.dtype == keys.dtype == values.dtype == mx.float32
                and queries.shape[1] % keys.shape[1] == 0):
            if rows >= MIN_ROWS:
                return causal_attention(queries, keys, values, scale, ext)
            return ext.few_row_attention(queries, keys, values, scale, native.kernel_threads())
        return original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks, **kwargs)

    setattr(scaled_dot_product_attention, _MARK, True)
    return scaled_dot_product_attention
