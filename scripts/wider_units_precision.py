"""How far 8- and 16-bit activations move the default model's products (issue 25, "the CPU's wider
units"): VNNI and AMX-INT8 multiply int8 activations, AVX512-BF16 and AMX-BF16 bfloat16 ones,
AVX512-FP16 float16 ones. Real activations (the RMSNorm'd hidden states after layers 2, 14 and 26 of
a code prompt) go through the stored model's q and gate products at float32, and again rounded to
each format; the weights stay exact, so this is a lower bound on those units' error. Printed:
max |difference| / max |float32 product|, against the kernels' 1e-4 (docs/native.md).

Run from the repository root: `PYTHONPATH=. .venv/bin/python scripts/wider_units_precision.py`
"""
from __future__ import annotations

import engine  # noqa: F401  (fast BLAS before mlx.core)
import mlx.core as mx
import numpy as np

from engine.loading.target import load_target
from engine.models.target import Target

PROMPT = ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
          '    return fibonacci(n - 1) + fibonacci(n - 2)\n')
LAYERS = (2, 14, 26)


def bfloat16(a: np.ndarray) -> np.ndarray:
    """a rounded to bfloat16 (to nearest, ties to even), back as float32."""
    bits = a.astype(np.float32).view(np.uint32)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return bits.view(np.float32)


def int8_blocks(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x [n, K] quantized to int8 with one scale per block of 32 (llama.cpp's Q8_0), dequantized."""
    xb = x.reshape(x.shape[0], -1, block)
    scale = np.abs(xb).max(-1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    return (np.round(xb / scale) * scale).reshape(x.shape)


def main() -> None:
    model, tok, _ = load_target(None, precision="stored")
    ids = tok.encode(PROMPT)
    target = Target(model, LAYERS)
    _, taps = target.forward(mx.array([ids]), target.make_cache())
    hidden = np.array(taps[0]).reshape(len(ids), len(LAYERS), -1)  # [n, layers, E]
    for i, layer_id in enumerate(LAYERS):
        layer = model.model.layers[layer_id]
        layer = layer["inner"] if "inner" in layer else layer  # the Target's tap wrapper
        h = hidden[:, i]
        x = h / np.sqrt((h**2).mean(-1, keepdims=True) + 1e-5) * np.array(layer.input_layernorm.weight)  # [n, E]
        for name, proj in (("q_proj", layer.self_attn.q_proj), ("gate_proj", layer.mlp.gate_proj)):
            reference = np.array(proj(mx.array(x.astype(np.float32))))
            errors = {}
            for kind, rounded in (("bfloat16", bfloat16(x)), ("float16", x.astype(np.float16).astype(np.float32)),
                                  ("int8 per 32", int8_blocks(x))):
                out = np.array(proj(mx.array(rounded.astype(np.float32))))
                errors[kind] = f"{np.abs(out - reference).max() / np.abs(reference).max():.1e}"
            print(f"layer {layer_id} {name}: {errors}")


if __name__ == "__main__":
    main()
