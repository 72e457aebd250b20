"""The drafter's Qwen3-style decoder layer: attention over [cached context ; block], SwiGLU MLP.

Shapes: d = hidden, H / Hkv = query / KV heads, hd = the attention head dim, B = block slots,
P = cached context rows. The Gemma-4 layer (`engine.models.gemma_drafter_layers`) subclasses
these and overrides only what differs: how K/V are formed, the scale, and `DrafterLayer.combine`.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from engine.models.drafter_config import DrafterConfig

# config hidden_activation / hidden_act -> the MLP's gate activation.
ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "silu": nn.silu,
    "gelu": nn.gelu,
    "gelu_pytorch_tanh": nn.gelu_approx,  # the tanh approximation, as Transformers names it
}


def split_heads(x: mx.array, n_heads: int) -> mx.array:
    """[b, L, n*hd] -> [b, n, L, hd]."""
    b, length, _ = x.shape
    return x.reshape(b, length, n_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x: mx.array) -> mx.array:
    """[b, n, L, hd] -> [b, L, n*hd]."""
    b, _, length, _ = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, length, -1)


class DrafterAttention(nn.Module):
    """Qwen3-style GQA attention whose keys/values are [cached context ; block], queries block only."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        d, hd, bias = cfg.hidden_size, cfg.attn_head_dim, cfg.attention_bias
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.attn_kv_heads
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        if not cfg.attention_k_eq_v:  # Gemma-4's K = V attention has no value projection
            self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)

    def project_kv(self, x: mx.array, rope: nn.Module, offset: int | mx.array) -> tuple[mx.array, mx.array]:
        """K/V of ``x`` [b, L, d] at positions [offset, offset+L): post-k_norm, post-RoPE [b, Hkv, L, hd]."""
        keys = self.k_norm(split_heads(self.k_proj(x), self.n_kv_heads))
        values = split_heads(self.v_proj(x), self.n_kv_heads)
        return rope(keys, offset=offset), values

    def project_q(self, x: mx.array, rope: nn.Module, offset: int | mx.array) -> mx.array:
        """Queries of ``x`` [b, L, d] at positions [offset, offset+L): [b, H, L, hd]."""
        return rope(self.q_norm(split_heads(self.q_proj(x), self.n_heads)), offset=offset)

    def __call__(self, x: mx.array, ctx_kv: tuple[mx.array, mx.array] | None, rope: nn.Module,
                 offset: int) -> mx.array:
        # x: [1, B, d] normed block stream at positions [offset, offset+B)
        queries = self.project_q(x, rope, offset)
        keys, values = self.project_kv(x, rope, offset)
        if ctx_kv is not None:
            keys = mx.concatenate([ctx_kv[0], keys], axis=2)  # [1, Hkv, P+B, hd]
            values = mx.concatenate([ctx_kv[1], values], axis=2)
        # No mask: the block is bidirectional and sees every cached context position (< offset).
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale)
        return self.o_proj(merge_heads(out))


class DrafterMLP(nn.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)); SwiGLU for Qwen3, GeGLU (tanh) for Gemma-4."""

    def __init__(self, d: int, hidden: int, activation: str = "silu"):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)
        # A plain attribute: a function is no parameter.
        object.__setattr__(self, "_act", ACTIVATIONS[activation])

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    """Pre-norm decoder layer; context features bypass input_layernorm (docs/method.md §3.1)."""

    attention_class = DrafterAttention

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.self_attn = self.attention_class(cfg)
        self.mlp = DrafterMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_activation)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def append_context(self, ctx_h: mx.array, cache: KVCache, rope: nn.Module) -> None:
        """Project ``ctx_h`` [1, c, d] (already fc + hidden_norm) to K/V at the cache's next positions."""
        keys, values = self.self_attn.project_kv(ctx_h, rope, cache.offset)
        cache.update_and_fetch(keys, values)

    def combine(self, x: mx.array, attn_out: mx.array) -> mx.array:
        """The layer's output from its input x and its attention output (o_proj applied): [.., B, d].

        Everything after attention lives here, so the serving, reference and training paths
        (which form attention differently) share it.
        """
        h = x + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))

    def __call__(self, x: mx.array, cache: KVCache, rope: nn.Module, offset: int) -> mx.array:
        ctx_kv = cache.keys_and_values() if cache.offset > 0 else None
        return self.combine(x, self.self_attn(self.input_layernorm(x), ctx_kv, rope, offset))
