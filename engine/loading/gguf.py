"""Convert a llama-architecture GGUF file into an mlx-lm model directory.

MLX reads GGUF natively (`mx.load(..., return_metadata=True)`): Q4_0/Q4_1/Q8_0 tensors arrive as
MLX quantized triplets (weight, scales, biases; group size 32) and every metadata field, including
the BPE vocabulary and merges, comes back as Python values. We dequantize to float32 (the fast CPU
path; quantized matmul on CPU is 7-29x slower), undo llama.cpp's Q/K row permutation, and write
config.json, model.safetensors, tokenizer.json and tokenizer_config.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from engine.loading.gguf_tokenizer import write_tokenizer

ProgressFn = Callable[[str], None]

GGUF_GROUP_SIZE = 32

# GGUF tensor name -> mlx-lm llama name (per block, then global).
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFError(ValueError):
    """The GGUF file is not something this converter supports."""


def unpermute_qk(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's interleaved-RoPE row order for a Q or K projection.

    llama.cpp's converter reorders each head's rows from HF's "rotate half" layout
    [x0..x(h/2-1), y0..y(h/2-1)] into interleaved pairs [x0, y0, x1, y1, ...]; MLX's
    non-traditional RoPE expects HF's layout. w: [n_heads * head_dim, d_in].
    """
    rows, cols = w.shape
    head_dim = rows // n_heads
    w = w.reshape(n_heads, head_dim // 2, 2, cols)  # [H, hd/2, 2, d_in] interleaved pairs
    return w.swapaxes(1, 2).reshape(rows, cols)


def _metadata_int(meta: dict, key: str) -> int:
    if key not in meta:
        raise GGUFError(f"GGUF metadata lacks '{key}'")
    return int(meta[key].item()) if isinstance(meta[key], mx.array) else int(meta[key])


def _metadata_float(meta: dict, key: str, default: float) -> float:
    value = meta.get(key)
    if value is None:
        return default
    return float(value.item()) if isinstance(value, mx.array) else float(value)


def llama_config(meta: dict) -> dict:
    """mlx-lm/HF llama config.json built from GGUF metadata."""
    if meta.get("general.architecture") != "llama":
        raise GGUFError(f"unsupported GGUF architecture {meta.get('general.architecture')!r}; only 'llama'")
    hidden = _metadata_int(meta, "llama.embedding_length")
    heads = _metadata_int(meta, "llama.attention.head_count")
    vocab = len(meta["tokenizer.ggml.tokens"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _metadata_int(meta, "llama.feed_forward_length"),
        "num_hidden_layers": _metadata_int(meta, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _metadata_int(meta, "llama.attention.head_count_kv"),
        "head_dim": hidden // heads,
        "rms_norm_eps": _metadata_float(meta, "llama.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": _metadata_float(meta, "llama.rope.freq_base", 10000.0),
        "max_position_embeddings": _metadata_int(meta, "llama.context_length"),
        "vocab_size": vocab,
        "bos_token_id": _metadata_int(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _metadata_int(meta, "tokenizer.ggml.eos_token_id"),
        "tie_word_embeddings": True,  # corrected below when the file has its own output.weight
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _dequantized(tensors: dict[str, mx.array], base: str) -> mx.array:
    """Float32 weight for GGUF tensor `base`, dequantizing MLX quantized triplets."""
    weight = tensors[base + ".weight"]
    scales = tensors.get(base + ".scales")
    if scales is None:
        return weight.astype(mx.float32)
    # Packed uint32 columns per scale group give the bit width: 32 * cols / (groups * 32).
    bits = weight.shape[-1] // scales.shape[-1]
    out = mx.dequantize(weight, scales, tensors[base + ".biases"], group_size=GGUF_GROUP_SIZE, bits=bits)
    return out.astype(mx.float32)


def _mlx_name(base: str) -> str:
    if base.startswith("blk."):
        _, idx, kind = base.split(".", 2)
        if kind not in _BLOCK_NAMES:
            raise GGUFError(f"unexpected GGUF tensor '{base}'")
        return f"model.layers.{idx}.{_BLOCK_NAMES[kind]}.weight"
    if base not in _GLOBAL_NAMES:
        raise GGUFError(f"unexpected GGUF tensor '{base}'")
    return _GLOBAL_NAMES[base] + ".weight"


def convert_weights(tensors: dict[str, mx.array], config: dict, progress: ProgressFn | None = None) -> dict:
    """GGUF tensors -> float32 mlx-lm weights, with Q/K rows un-permuted."""
    bases = sorted({name.rsplit(".", 1)[0] for name in tensors})
    out: dict[str, mx.array] = {}
    for i, base in enumerate(bases):
        w = _dequantized(tensors, base)
        if base.endswith(".attn_q"):
            w = unpermute_qk(w, config["num_attention_heads"])
        elif base.endswith(".attn_k"):
            w = unpermute_qk(w, config["num_key_value_heads"])
        name = _mlx_name(base)
        out[name] = w
        mx.eval(w)
        if progress and (i + 1) % 40 == 0:
            progress(f"converted {i + 1}/{len(bases)} tensors")
    return out


def convert_gguf(gguf_path: Path, out_dir: Path, progress: ProgressFn | None = None) -> None:
    """Write an mlx-lm model directory (config, float32 weights, tokenizer) into `out_dir`."""
    tensors, meta = mx.load(str(gguf_path), return_metadata=True)
    config = llama_config(meta)
    weights = convert_weights(tensors, config, progress)
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(meta, out_dir)
    if progress:
        progress(f"wrote {len(weights)} tensors and the tokenizer to {out_dir}")
