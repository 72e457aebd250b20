"""The Gemma-4 part of drafter configs: DeepSpec `Gemma4DSparkModel` keys in, and back out.

DeepSpec writes this drafter's config.json by deep-copying the target's Gemma-4 ``text_config``
and adding the DSpark keys (``deepspec/modeling/dspark/gemma4/config.py``, `build_draft_config`),
so the file also carries target-only keys (sliding-window head_dim, per-layer-input sizes, the
sliding RoPE) that the drafter never uses. What the drafter does use (``gemma4/modeling.py``):

  * attention head dim ``global_head_dim``; with ``attention_k_eq_v`` there is no v_proj (V = K
    before the norms) and the KV head count is ``num_global_key_value_heads``;
  * RoPE from ``rope_parameters["full_attention"]`` (Gemma-4-12B: proportional, partial 0.25);
  * ``final_logit_softcapping`` and ``hidden_activation``.

Variants DeepSpec itself refuses (MoE block, per-layer input gates) are refused here too, with
the reason. Plain data only: nothing here imports MLX. `engine.models.drafter_config` calls in.
"""

from __future__ import annotations

from typing import Any

GEMMA4_ARCH = "Gemma4DSparkModel"
QWEN3_FAMILY, GEMMA4_FAMILY = "qwen3", "gemma4"
# hidden_activation names (Transformers' ACT2FN keys) the drafter's MLP implements.
GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu", "silu")
_GEMMA_REQUIRED = ("global_head_dim", "rope_parameters")


class GemmaVariantError(ValueError):
    """A Gemma-4 drafter config names a variant we do not implement; the message says which."""


def gemma_rope_source(raw: dict) -> dict:
    """The full-attention RoPE dict in the flat shape the shared rope parser reads.

    Gemma-4 nests RoPE per layer type; every drafter layer is full attention, so only
    ``rope_parameters["full_attention"]`` applies (DeepSpec: ``layer_type="full_attention"``).
    """
    params = raw.get("rope_parameters") or {}
    full = params.get("full_attention") if isinstance(params, dict) else None
    if not isinstance(full, dict):
        raise GemmaVariantError("Gemma-4 drafter config has no rope_parameters['full_attention'] "
                                "(the drafter's layers are all full attention)")
    return {"rope_parameters": full}


def gemma_fields(raw: dict) -> dict[str, Any]:
    """The `DrafterConfig` fields specific to a Gemma-4 drafter, read from its config.json dict."""
    check_gemma_variant(raw)
    gemma_rope_source(raw)  # refuse a config without the full-attention RoPE here, with the rest
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    global_kv = raw.get("num_global_key_value_heads")
    if k_eq_v and global_kv is None:
        raise GemmaVariantError("attention_k_eq_v is set but num_global_key_value_heads is missing")
    softcap = raw.get("final_logit_softcapping")
    if softcap is not None and float(softcap) <= 0:
        raise GemmaVariantError(f"final_logit_softcapping must be positive, got {softcap}")
    return dict(
        family=GEMMA4_FAMILY,
        global_head_dim=int(raw["global_head_dim"]),
        num_global_key_value_heads=None if global_kv is None else int(global_kv),
        attention_k_eq_v=k_eq_v,
        final_logit_softcapping=None if softcap is None else float(softcap),
        hidden_activation=str(raw.get("hidden_activation") or "gelu_pytorch_tanh"),
    )


def check_gemma_variant(raw: dict) -> None:
    """Raise `GemmaVariantError` for Gemma-4 drafter variants the MLX drafter does not implement."""
    missing = [k for k in _GEMMA_REQUIRED if raw.get(k) is None]
    if missing:
        raise GemmaVariantError(f"Gemma-4 drafter config is missing {', '.join(missing)}")
    if raw.get("enable_moe_block"):
        raise GemmaVariantError("Gemma-4 drafters with a MoE block (enable_moe_block) are not supported "
                                "(DeepSpec's Gemma4DSparkModel refuses them too)")
    if int(raw.get("hidden_size_per_layer_input") or 0) != 0:
        raise GemmaVariantError("Gemma-4 drafters with per-layer input gates (hidden_size_per_layer_input "
                                "> 0, the E2B/E4B targets) are not supported (DeepSpec refuses them too)")
    if raw.get("use_double_wide_mlp") and int(raw.get("num_kv_shared_layers") or 0) > 0:
        # Transformers widens the MLP of KV-shared layers; which drafter layers that hits depends on
        # the Transformers version, so rather than guess a width, refuse.
        raise GemmaVariantError("Gemma-4 drafters copied from a target with double-wide MLPs on KV-shared "
                                "layers (use_double_wide_mlp with num_kv_shared_layers > 0) are not supported")
    act = raw.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in GEMMA_ACTIVATIONS:
        raise GemmaVariantError(f"hidden_activation {act!r} is not supported; "
                                f"supported: {', '.join(GEMMA_ACTIVATIONS)}")


def gemma_raw(cfg: Any) -> dict[str, Any]:
    """The Gemma-4 keys of ``cfg``'s config.json (`gemma_fields` and the rope parser read them back).

    ``cfg`` is a `DrafterConfig` of family "gemma4"; the sliding-attention entries are the
    target's and unused by the drafter, so they are written only as far as Transformers needs.
    """
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta} | dict(cfg.rope_scaling or {})
    return {
        "model_type": "gemma4_text",
        "architectures": [GEMMA4_ARCH],
        "global_head_dim": cfg.global_head_dim,
        "num_global_key_value_heads": cfg.num_global_key_value_heads,
        "attention_k_eq_v": cfg.attention_k_eq_v,
        "final_logit_softcapping": cfg.final_logit_softcapping,
        "hidden_activation": cfg.hidden_activation,
        "rope_parameters": {"full_attention": full,
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        "enable_moe_block": False,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
    }
