"""Batched, masked drafter backbone for training: many anchor blocks per sequence in one pass.

It reuses the drafter's own modules (projections, q/k norms, RoPE, MLP, norms), so what is trained
is exactly what `Drafter.backbone` serves. Per layer and sequence the context K/V are projected
once for all W positions; every block's queries then attend to the context positions before its
anchor and to its own block (bidirectional), through one boolean mask (docs/method.md §3.1, §8):

    keys = [context (W) ; block 0 (Bs) ; block 1 (Bs) ; ...]     per sequence
    row (n, j) may see: context s < anchor_n, and block n

With one anchor this equals `Drafter.reference_forward(taps[:, :anchor], block)` (tested), which in
turn equals the cached serving path.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engine.models.drafter import Drafter, DrafterLayer


def train_backbone(drafter: Drafter, taps: mx.array, block_ids: mx.array, anchors: mx.array,
                   attn_mask: mx.array, trace: list | None = None) -> mx.array:
    """Final-normed hidden states of every block: [b*N, Bs, d].

    taps [b, W, m*d]; block_ids [b*N, Bs] (sequence-major); anchors [b*N] absolute anchor
    positions; attn_mask [b, 1, N*Bs, W + N*Bs] bool (see `engine.train.batch.attention_mask`).
    ``trace``, when given, receives the residual stream [b*N, Bs, d] after the embedding and
    after each layer (the trainer's instruments read its norms).
    """
    b = taps.shape[0]
    ctx_h = drafter.project_context(taps)  # [b, W, d]
    x = drafter.embed(block_ids)  # [b*N, Bs, d]
    if trace is not None:
        trace.append(x)
    for layer in drafter.layers:
        x = _layer(layer, x, ctx_h, anchors, attn_mask, drafter._rope, b)
        if trace is not None:
            trace.append(x)
    return drafter.norm(x)


def draft_rows(drafter: Drafter, h: mx.array, rows: mx.array) -> mx.array:
    """Gather the draft rows [R, d] from h [b*N, Bs, d]; ``rows`` index the [b*N*Bd] draft slots."""
    hd = drafter.draft_hidden(h)  # [b*N, Bd, d]
    return hd.reshape(-1, hd.shape[-1])[rows]


def _layer(layer: DrafterLayer, x: mx.array, ctx_h: mx.array, anchors: mx.array, mask: mx.array,
           rope: nn.Module, b: int) -> mx.array:
    attn = layer.self_attn
    xn = layer.input_layernorm(x)  # the block stream only; context rows are not re-normed
    ctx_k, ctx_v = attn.project_kv(ctx_h, rope, 0)  # [b, Hkv, W, hd] at positions 0..W-1
    # Per-block RoPE offsets: block n sits at anchors[n] .. anchors[n] + Bs - 1.
    queries = _to_rows(attn.project_q(xn, rope, anchors), b)  # [b, H, N*Bs, hd]
    keys, values = attn.project_kv(xn, rope, anchors)  # [b*N, Hkv, Bs, hd]
    keys = mx.concatenate([ctx_k, _to_rows(keys, b)], axis=2)  # [b, Hkv, W + N*Bs, hd]
    values = mx.concatenate([ctx_v, _to_rows(values, b)], axis=2)
    out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=attn.scale, mask=mask)
    return layer.combine(x, attn.o_proj(_from_rows(out, x.shape[0] // b)))


def _to_rows(x: mx.array, b: int) -> mx.array:
    # [b*N, H, Bs, hd] -> [b, H, N*Bs, hd] (block-major rows within each sequence)
    bn, heads, slots, hd = x.shape
    n = bn // b
    return x.reshape(b, n, heads, slots, hd).transpose(0, 2, 1, 3, 4).reshape(b, heads, n * slots, hd)


def _from_rows(x: mx.array, n: int) -> mx.array:
    # [b, H, N*Bs, hd] -> [b*N, Bs, H*hd]
    b, heads, rows, hd = x.shape
    slots = rows // n
    return x.reshape(b, heads, n, slots, hd).transpose(0, 2, 3, 1, 4).reshape(b * n, slots, heads * hd)
