"""The Gemma-4 DSpark drafter layer (DeepSpec `Gemma4DSparkDecoderLayer`), as overrides of the Qwen3 one.

What differs (docs/method.md §4.1, deepspec/modeling/dspark/gemma4/modeling.py):
  * K = V when ``attention_k_eq_v``: one k_proj; its output is k_norm'ed (+ RoPE) for keys and
    RMS-normalised without a scale (``v_norm``) for values. Without K = V there is a v_proj,
    and its output gets the same scale-free v_norm.
  * attention scaling 1.0 (q_norm / k_norm already fix the logits' scale; there is no 1/sqrt(hd));
  * sandwich norms: the attention and MLP outputs are each RMS-normed before their residual add,
    the MLP input has its own pre_feedforward_layernorm;
  * the layer output (residual included) times ``layer_scalar``, a [1] buffer that DeepSpec
    saves with the weights but never trains (it stays 1.0).
Gemma4RMSNorm scales by ``w`` (not Gemma-3's ``1 + w``: Transformers' gemma4 module initialises
the weight to ones and multiplies by it), which is exactly `nn.RMSNorm`.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engine.models.drafter_config import DrafterConfig
from engine.models.drafter_layers import DrafterAttention, DrafterLayer, split_heads


class GemmaDrafterAttention(DrafterAttention):
    """Gemma-4 full attention: head dim ``global_head_dim``, K = V, scale-free v_norm, scaling 1.0."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        self.scale = 1.0
        object.__setattr__(self, "_eps", cfg.rms_norm_eps)  # v_norm has no weight: nothing to load

    def project_kv(self, x: mx.array, rope: nn.Module, offset: int | mx.array) -> tuple[mx.array, mx.array]:
        """K/V of ``x`` [b, L, d] at positions [offset, offset+L): [b, Hkv, L, hd] each.

        Keys: k_norm then RoPE. Values: v_norm (RMS, no scale) of v_proj, or of k_proj's output
        before k_norm when K = V; values carry no RoPE.
        """
        raw_k = split_heads(self.k_proj(x), self.n_kv_heads)  # [b, Hkv, L, hd]
        raw_v = raw_k if "v_proj" not in self else split_heads(self.v_proj(x), self.n_kv_heads)
        values = mx.fast.rms_norm(raw_v, None, self._eps)
        return rope(self.k_norm(raw_k), offset=offset), values


class GemmaDrafterLayer(DrafterLayer):
    """Gemma-4 sandwich layer: attention and MLP outputs normed before their residual adds, then x layer_scalar."""

    attention_class = GemmaDrafterAttention

    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_feedforward_layernorm = nn.RMSNorm(d, eps=eps)
        self.post_feedforward_layernorm = nn.RMSNorm(d, eps=eps)
        self.layer_scalar = mx.ones((1,))  # a checkpoint tensor, never a trained one
        self.freeze(keys=["layer_scalar"], recurse=False)

    def combine(self, x: mx.array, attn_out: mx.array) -> mx.array:
        """x + post_attn_norm(attn); then + post_ff_norm(mlp(pre_ff_norm(.))); all times layer_scalar."""
        h = x + self.post_attention_layernorm(attn_out)
        h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        return h * self.layer_scalar.astype(h.dtype)
