"""Cached reference decodes of the default model, for tests that compare against plain greedy.

mlx-lm's one-token-at-a-time greedy decode is the slowest part of the SmolLM2 equivalence test and
its output depends only on the weights, the prompt, MLX, the BLAS and the kernels the linears run
on. It is computed once and kept in the model cache (`DSPARK_CACHE`), keyed by the weight file's
sha256, the MLX version, the BLAS and those kernels, so a new MLX, BLAS, kernel or model recomputes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from engine.backend import STATE as BLAS
from engine.loading.default_model import cache_root, sha256_file
from engine.native.linear import PackedLinear, QuantizedPanelLinear


@functools.cache
def _weights_sha256(model_dir: str) -> str:
    return sha256_file(Path(model_dir) / "model.safetensors")


def plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy decoding of n tokens after `prompt` (the uncached reference)."""
    argmax = lambda x: mx.argmax(x, axis=-1)  # noqa: E731
    return [int(token) for token, _ in generate_step(mx.array(prompt), model, max_tokens=n, sampler=argmax)]


def _products(model) -> str:
    """Which kernels the model's linears run on (their numbers differ): the native panels', or MLX's."""
    kinds = sorted({type(m).__name__ for _, m in model.named_modules() if isinstance(m, (PackedLinear, QuantizedPanelLinear))})
    return "+".join(kinds) or "mlx"


def cached_plain_greedy(model_dir: Path, model, prompt: list[int], n: int) -> list[int]:
    """`plain_greedy`, read from the cache when this model, MLX, BLAS, linear kernels, prompt and n
    were decoded before."""
    parts = [_weights_sha256(str(model_dir)), mx.__version__, BLAS.name, _products(model), json.dumps(prompt), str(n),
             "greedy-v1"]
    path = cache_root() / "test-references" / f"{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:24]}.json"
    if path.exists():
        return json.loads(path.read_text())
    out = plain_greedy(model, prompt, n)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{id(out)}.tmp")  # two test workers may write the same entry
    tmp.write_text(json.dumps(out))
    tmp.replace(path)
    return out
