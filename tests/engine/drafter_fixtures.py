"""Tiny drafter checkpoints with the real tensor names and config.json shapes of each layout.

Tensor names are spelled out here from docs/method.md (§4.3) and DeepSpec's modeling code, not
derived from `engine.models.drafter`, so the loader's name mapping is actually under test.
Geometry: hidden 64, 2 draft layers, 4 heads / 2 KV heads of 16, vocab 256, block 4, taps [0, 1]
of a 4-layer target, Markov rank 8. Weights are stored as bfloat16, as the published ones are.
"""

from __future__ import annotations

import json
from pathlib import Path

import engine  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 4, 2, 16
VOCAB, BLOCK, TAPS, TARGET_LAYERS, RANK = 256, 4, [0, 1], 4, 8
MASK_ID = 250

Shapes = dict[str, tuple[int, ...]]


def _geometry() -> dict:
    return {
        "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "model_type": "qwen3",
    }


def deepspec_config(**overrides) -> dict:
    """DeepSpec `Qwen3DSparkModel` config: a copied target config plus the top-level DSpark keys."""
    raw = _geometry() | {
        "architectures": ["Qwen3DSparkModel"], "torch_dtype": "bfloat16", "rope_theta": 1000000.0,
        "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "use_sliding_window": False, "sliding_window": None, "layer_types": ["full_attention"] * LAYERS,
        "block_size": BLOCK, "mask_token_id": MASK_ID, "target_layer_ids": TAPS,
        "num_target_layers": TARGET_LAYERS, "num_anchors": 512, "markov_rank": RANK,
        "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True,
    }
    return raw | overrides


def dflash_config(*, nested_block_size: bool = False, **overrides) -> dict:
    """z-lab `DFlashDraftModel` config, auto_map included as on the Hub (we must ignore it)."""
    raw = _geometry() | {
        "architectures": ["DFlashDraftModel"], "dtype": "bfloat16", "tie_word_embeddings": True,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": TAPS},
    }
    if nested_block_size:
        # Newer z-lab packaging: block_size nested, rope_theta under rope_parameters.
        raw["dflash_config"]["block_size"] = BLOCK
        raw["rope_parameters"] = {"rope_theta": 1000000.0, "rope_type": "default"}
    else:
        raw.update(block_size=BLOCK, rope_theta=1000000.0)
    return raw | overrides


def legacy_dspark_config(**overrides) -> dict:
    """SpecForge `DSparkDraftModel`: DFlash-style nesting plus Markov / confidence keys, no embeddings."""
    raw = _geometry() | {
        "architectures": ["DSparkDraftModel"], "rope_theta": 1000000.0, "block_size": BLOCK,
        "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": TAPS, "markov_rank": RANK,
                          "markov_head_type": "vanilla"},
        "enable_confidence_head": True, "confidence_head_with_markov": True,
    }
    return raw | overrides


def backbone_shapes(num_taps: int = len(TAPS)) -> Shapes:
    """fc / norms / layers.* exactly as in z-lab's and DeepSpec's state dicts (no 'model.' prefix)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes: Shapes = {"fc.weight": (HIDDEN, num_taps * HIDDEN), "hidden_norm.weight": (HIDDEN,),
                      "norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (q, HIDDEN), p + "self_attn.k_proj.weight": (kv, HIDDEN),
            p + "self_attn.v_proj.weight": (kv, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, q),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (INTER, HIDDEN), p + "mlp.up_proj.weight": (INTER, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTER),
        }
    return shapes


def head_shapes(markov_head_type: str = "vanilla", confidence: bool = True) -> Shapes:
    """DeepSpec Markov head (W1 [V, r], W2 stored [V, r]) and confidence head ([1, d + r] + bias)."""
    shapes: Shapes = {"markov_head.markov_w1.weight": (VOCAB, RANK),
                      "markov_head.markov_w2.weight": (VOCAB, RANK)}
    if markov_head_type == "gated":
        shapes |= {"markov_head.gate_proj.weight": (RANK, HIDDEN + RANK),
                   "markov_head.gate_proj.bias": (RANK,)}
    if markov_head_type == "rnn":
        shapes |= {"markov_head.joint_proj.weight": (3 * RANK, 2 * RANK + HIDDEN),
                   "markov_head.joint_proj.bias": (3 * RANK,)}
    if confidence:
        shapes |= {"confidence_head.proj.weight": (1, HIDDEN + RANK), "confidence_head.proj.bias": (1,)}
    return shapes


def deepspec_shapes(markov_head_type: str = "vanilla") -> Shapes:
    """Full DeepSpec state dict: backbone, frozen embed_tokens / lm_head copies, both heads."""
    return backbone_shapes() | head_shapes(markov_head_type) | {
        "embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN)}


def random_weights(shapes: Shapes, seed: int = 0) -> dict[str, mx.array]:
    """Well-scaled random tensors: norm scales near 1, matrices ~ N(0, 1/fan_in), small biases."""
    keys = mx.random.split(mx.random.key(seed), len(shapes))
    out = {}
    for key, (name, shape) in zip(keys, sorted(shapes.items())):
        noise = mx.random.normal(shape, key=key)
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * noise
        elif len(shape) == 1:
            out[name] = 0.1 * noise
        else:
            out[name] = noise * shape[-1] ** -0.5
    return out


def write_checkpoint(directory: Path, raw: dict, weights: dict[str, mx.array], *, shards: int = 1,
                     dtype: mx.Dtype = mx.bfloat16) -> Path:
    """config.json plus model.safetensors, or ``shards`` files with a model.safetensors.index.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw))
    names = sorted(weights)
    if shards == 1:
        _save(directory / "model.safetensors", {n: weights[n] for n in names}, dtype)
        return directory
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        _save(directory / file, {n: weights[n] for n in part}, dtype)
        weight_map |= {n: file for n in part}
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def write_deepspec(directory: Path, *, seed: int = 0, markov_head_type: str = "vanilla", **config) -> Path:
    """A complete tiny DeepSpec (`Qwen3DSparkModel`) checkpoint."""
    raw = deepspec_config(markov_head_type=markov_head_type, **config)
    return write_checkpoint(directory, raw, random_weights(deepspec_shapes(markov_head_type), seed))


def write_dflash(directory: Path, *, seed: int = 1, nested_block_size: bool = False, shards: int = 1) -> Path:
    """A complete tiny z-lab (`DFlashDraftModel`) checkpoint: backbone only."""
    raw = dflash_config(nested_block_size=nested_block_size)
    return write_checkpoint(directory, raw, random_weights(backbone_shapes(), seed), shards=shards)


def write_legacy_dspark(directory: Path, *, seed: int = 2) -> Path:
    """A tiny SpecForge `DSparkDraftModel` checkpoint: backbone and heads, no embedding copies."""
    weights = random_weights(backbone_shapes() | head_shapes(), seed)
    return write_checkpoint(directory, legacy_dspark_config(), weights)


def fake_target_embedding(seed: int = 7) -> mx.array:
    """A stand-in target embedding table [V, d] for layouts that bind the target's."""
    return mx.random.normal((VOCAB, HIDDEN), key=mx.random.key(seed)) * 0.5


def _save(path: Path, arrays: dict[str, mx.array], dtype: mx.Dtype) -> None:
    mx.save_safetensors(str(path), {k: v.astype(dtype) for k, v in arrays.items()}, metadata={"format": "pt"})
