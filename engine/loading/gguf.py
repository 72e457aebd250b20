"""Convert a llama-architecture GGUF file into an mlx-lm model directory.

MLX reads GGUF natively (`mx.load(..., return_metadata=True)`): Q4_0/Q4_1/Q8_0 tensors arrive as
MLX quantized triplets (weight, scales, biases; group size 32) and every metadata field, including
the BPE vocabulary and merges, comes back as Python values. We undo llama.cpp's Q/K row permutation
and write config.json, model.safetensors, tokenizer.json and tokenizer_config.json, at one of two
precisions:

    "float32"  dequantize every tensor to float32 (the fast CPU path; quantized matmul on CPU is
               7-29x slower). The default.
    "stored"   keep each quantized tensor as its MLX triplet at the file's own bit width (a fraction
               of the memory), with a config.json "quantization" entry that makes mlx-lm build
               QuantizedLinear / QuantizedEmbedding layers for them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from engine.loading.gguf_tokenizer import write_tokenizer

ProgressFn = Callable[[str], None]

GGUF_GROUP_SIZE = 32
PRECISIONS = ("float32", "stored")
_TRIPLET = ("weight", "scales", "biases")  # MLX affine quantization: w = q * scales + biases, per group

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
    non-traditional RoPE expects HF's layout. w: [n_heads * head_dim, cols], any dtype: a float
    weight (cols = d_in) or one array of a quantized triplet (packed uint32 weight, float16 scales
    or biases). Rows are output features and quantization groups run along the columns, so moving
    whole rows of each array of a triplet is exact.
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


def check_precision(precision: str) -> None:
    """Raise ValueError unless `precision` is one of PRECISIONS."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")


def quantized_bits(weight: mx.array, scales: mx.array, group_size: int = GGUF_GROUP_SIZE) -> int:
    """Bit width of an MLX affine triplet from its shapes.

    weight: [rows, d_in * bits / 32] packed uint32; scales: [rows, d_in / group_size].
    """
    return weight.shape[-1] * 32 // (scales.shape[-1] * group_size)


def _dequantized(tensors: dict[str, mx.array], base: str) -> mx.array:
    """Float32 weight for GGUF tensor `base`, dequantizing MLX quantized triplets."""
    weight = tensors[base + ".weight"]
    scales = tensors.get(base + ".scales")
    if scales is None:
        return weight.astype(mx.float32)
    bits = quantized_bits(weight, scales)
    # Dequantized in the scales' float16, then widened: the stored path reproduces these values exactly.
    out = mx.dequantize(weight, scales, tensors[base + ".biases"], group_size=GGUF_GROUP_SIZE, bits=bits)
    return out.astype(mx.float32)


def _stored(tensors: dict[str, mx.array], base: str) -> dict[str, mx.array]:
    """suffix -> array for GGUF tensor `base` at its stored precision.

    A quantized tensor keeps its triplet as MLX returned it (uint32 weight, float16 scales/biases);
    anything MLX hands back unquantized (norms, other GGUF types) becomes float32, as in the
    float32 path.
    """
    if base + ".scales" not in tensors:
        return {"weight": tensors[base + ".weight"].astype(mx.float32)}
    return {suffix: tensors[f"{base}.{suffix}"] for suffix in _TRIPLET}


def _qk_heads(base: str, config: dict) -> int | None:
    """Head count whose row order llama.cpp permuted for `base` (None: not a Q/K projection)."""
    if base.endswith(".attn_q"):
        return config["num_attention_heads"]
    if base.endswith(".attn_k"):
        return config["num_key_value_heads"]
    return None


def _mlx_module(base: str) -> str:
    """mlx-lm module path (no .weight suffix) of GGUF tensor `base`."""
    if base.startswith("blk."):
        _, idx, kind = base.split(".", 2)
        if kind not in _BLOCK_NAMES:
            raise GGUFError(f"unexpected GGUF tensor '{base}'")
        return f"model.layers.{idx}.{_BLOCK_NAMES[kind]}"
    if base not in _GLOBAL_NAMES:
        raise GGUFError(f"unexpected GGUF tensor '{base}'")
    return _GLOBAL_NAMES[base]


def _converted(tensors: dict[str, mx.array], base: str, config: dict, precision: str) -> dict[str, mx.array]:
    """suffix -> array for one GGUF tensor at `precision`, with Q/K rows un-permuted."""
    parts = {"weight": _dequantized(tensors, base)} if precision == "float32" else _stored(tensors, base)
    heads = _qk_heads(base, config)
    if heads is not None:
        # Every array of a triplet shares the [n_heads * head_dim] row axis, so all move together.
        parts = {suffix: unpermute_qk(arr, heads) for suffix, arr in parts.items()}
    return parts


def convert_weights(
    tensors: dict[str, mx.array], config: dict, progress: ProgressFn | None = None, precision: str = "float32"
) -> dict:
    """GGUF tensors -> mlx-lm weights at `precision` ("float32" or "stored"), Q/K rows un-permuted.

    "stored" names each quantized module's triplet `<module>.weight/.scales/.biases`.
    """
    check_precision(precision)
    bases = sorted({name.rsplit(".", 1)[0] for name in tensors})
    out: dict[str, mx.array] = {}
    for i, base in enumerate(bases):
        parts = _converted(tensors, base, config, precision)
        module = _mlx_module(base)
        out.update({f"{module}.{suffix}": arr for suffix, arr in parts.items()})
        mx.eval(*parts.values())  # one tensor at a time, so the lazy graph never holds them all
        if progress and (i + 1) % 40 == 0:
            progress(f"converted {i + 1}/{len(bases)} tensors")
    return out


def quantization_config(weights: dict[str, mx.array], group_size: int = GGUF_GROUP_SIZE) -> dict | None:
    """config.json "quantization" entry for stored-precision weights (None when nothing is quantized).

    mlx-lm's load_model quantizes the modules nn.quantize's predicate accepts: a module whose path
    is a key here gets that dict as its to_quantized() arguments, and the top-level group_size /
    bits / mode serve the rest. The top level takes the most common bit width; each module with
    another width is named, so the layers match the file however a mlx-lm version infers defaults.
    """
    modules = [name.removesuffix(".scales") for name in weights if name.endswith(".scales")]
    bits = {m: quantized_bits(weights[m + ".weight"], weights[m + ".scales"], group_size) for m in modules}
    if not bits:
        return None
    common = Counter(bits.values()).most_common(1)[0][0]
    entry: dict = {"group_size": group_size, "bits": common, "mode": "affine"}
    for module, b in sorted(bits.items()):
        if b != common:
            entry[module] = {"group_size": group_size, "bits": b, "mode": "affine"}
    return entry


def convert_gguf(
    gguf_path: Path, out_dir: Path, progress: ProgressFn | None = None, precision: str = "float32"
) -> None:
    """Write an mlx-lm model directory (config, weights at `precision`, tokenizer) into `out_dir`."""
    check_precision(precision)
    tensors, meta = mx.load(str(gguf_path), return_metadata=True)
    config = llama_config(meta)
    weights = convert_weights(tensors, config, progress, precision)
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    quantization = quantization_config(weights) if precision == "stored" else None
    if quantization is not None:
        config["quantization"] = quantization
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(meta, out_dir)
    if progress:
        progress(f"wrote {len(weights)} tensors and the tokenizer to {out_dir}")
