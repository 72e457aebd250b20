"""Tiny Gemma-4 DSpark drafter checkpoints (DeepSpec `Gemma4DSparkModel`) for any target geometry.

`write_gemma4_dspark(dir, hidden_size=..., num_target_layers=..., vocab_size=..., target_layer_ids=...)`
writes config.json + model.safetensors that `engine.loading.drafter.load_drafter` reads, sized to
pair with a target of that geometry (e.g. a tiny Gemma-4 target built from mlx-vlm's classes,
whose hidden size, layer count and vocabulary must match).

As in `drafter_fixtures`, tensor names are spelled out from DeepSpec's module
(deepspec/modeling/dspark/gemma4/modeling.py: `Gemma4DSparkModel`, its decoder layer and
attention, common.py's `AcceptRatePredictor`, markov_head.py), not derived from our drafter, so
the loader's names are under test. The config is what DeepSpec's `build_draft_config` writes: the
target's Gemma-4 text config (sliding-window keys included, unused by the drafter) plus the
DSpark keys. Defaults: 2 draft layers, 4 query heads of `global_head_dim` 32, K = V with one
global KV head, proportional RoPE on a quarter of the head, logit soft-cap 30, block 4,
Markov rank 8, confidence head with Markov features, mask token 4 (Gemma-4-12B's).
"""

from __future__ import annotations

from pathlib import Path

import engine  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

from tests.engine.drafter_fixtures import Shapes, random_weights, write_checkpoint

GEMMA_MASK_ID = 4


def gemma4_dspark_config(*, hidden_size: int = 64, num_target_layers: int = 4, vocab_size: int = 256,
                         target_layer_ids: list[int] | tuple[int, ...] = (0, 1), **overrides) -> dict:
    """A DeepSpec Gemma4DSparkModel config.json dict (the copied text config plus the DSpark keys)."""
    raw = {
        # The target's Gemma-4 text config, as copied (sliding / per-layer-input keys unused here).
        "model_type": "gemma4_text", "vocab_size": vocab_size, "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "attention_bias": False, "attention_dropout": 0.0, "final_logit_softcapping": 30.0,
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "sliding_window": 512, "enable_moe_block": False, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": vocab_size, "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
        "initializer_range": 0.02, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
        "torch_dtype": "bfloat16",
        # What build_draft_config sets on top.
        "architectures": ["Gemma4DSparkModel"], "target_model_type": "gemma4",
        "target_text_model_type": "gemma4_text", "num_target_layers": num_target_layers,
        "num_hidden_layers": 2, "block_size": 4, "tie_word_embeddings": False,
        "mask_token_id": GEMMA_MASK_ID, "target_layer_ids": list(target_layer_ids), "num_anchors": 512,
        "enable_confidence_head": True, "confidence_head_with_markov": True,
        "markov_rank": 8, "markov_head_type": "vanilla",
    }
    raw["layer_types"] = ["full_attention"] * int(overrides.get("num_hidden_layers", raw["num_hidden_layers"]))
    return raw | overrides


def gemma4_dspark_shapes(raw: dict) -> Shapes:
    """The Gemma4DSparkModel state dict's tensor names and shapes for config ``raw``."""
    d, inter, v = raw["hidden_size"], raw["intermediate_size"], raw["vocab_size"]
    hd, heads = raw["global_head_dim"], raw["num_attention_heads"]
    k_eq_v = raw["attention_k_eq_v"]
    kv = (raw["num_global_key_value_heads"] if k_eq_v else raw["num_key_value_heads"]) * hd
    shapes: Shapes = {"embed_tokens.weight": (v, d), "lm_head.weight": (v, d), "norm.weight": (d,),
                      "fc.weight": (d, len(raw["target_layer_ids"]) * d), "hidden_norm.weight": (d,)}
    for i in range(raw["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + f"{n}.weight": (d,) for n in ("input_layernorm", "post_attention_layernorm",
                                                     "pre_feedforward_layernorm", "post_feedforward_layernorm")}
        shapes |= {
            p + "self_attn.q_proj.weight": (heads * hd, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, heads * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),  # v_norm: no weight
            p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d),
            p + "mlp.down_proj.weight": (d, inter),
            p + "layer_scalar": (1,),  # a persistent buffer, saved with the weights
        }
        if not k_eq_v:
            shapes[p + "self_attn.v_proj.weight"] = (kv, d)
    return shapes | _head_shapes(raw)


def _head_shapes(raw: dict) -> Shapes:
    d, v, r = raw["hidden_size"], raw["vocab_size"], raw["markov_rank"]
    shapes: Shapes = {}
    if r > 0:
        shapes |= {"markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r)}
        if raw["markov_head_type"] == "gated":
            shapes |= {"markov_head.gate_proj.weight": (r, d + r), "markov_head.gate_proj.bias": (r,)}
    if raw["enable_confidence_head"]:
        width = d + (r if raw["confidence_head_with_markov"] else 0)
        shapes |= {"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)}
    return shapes


def gemma4_dspark_weights(raw: dict, seed: int = 0) -> dict[str, mx.array]:
    """Random well-scaled weights under the published names; layer_scalar is DeepSpec's 1.0."""
    weights = random_weights(gemma4_dspark_shapes(raw), seed)
    return weights | {k: mx.ones((1,)) for k in weights if k.endswith("layer_scalar")}


def write_gemma4_dspark(directory: Path, *, hidden_size: int = 64, num_target_layers: int = 4,
                        vocab_size: int = 256, target_layer_ids: list[int] | tuple[int, ...] = (0, 1),
                        seed: int = 0, dtype: mx.Dtype = mx.bfloat16, **overrides) -> Path:
    """Write a tiny Gemma4DSparkModel checkpoint for a target of the given geometry; returns ``directory``.

    ``overrides`` replace config keys (e.g. ``num_hidden_layers``, ``block_size``, ``mask_token_id``,
    ``final_logit_softcapping``, ``attention_k_eq_v``). Load it with
    ``load_drafter(str(directory), target_vocab_size=vocab_size, target_num_layers=num_target_layers,
    target_hidden_size=hidden_size)``.
    """
    raw = gemma4_dspark_config(hidden_size=hidden_size, num_target_layers=num_target_layers,
                               vocab_size=vocab_size, target_layer_ids=target_layer_ids, **overrides)
    return write_checkpoint(Path(directory), raw, gemma4_dspark_weights(raw, seed), dtype=dtype)
