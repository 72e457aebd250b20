"""Resolve and load a target model: the embedded default, a local mlx-lm directory, or a HF id."""

from __future__ import annotations

import logging
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from engine.loading.default_model import ensure_default_model
from engine.loading.gguf import ProgressFn
from engine.loading.hub import HubUnavailableError, download, looks_like_hf_id
from engine import native
from engine.native.linear import requested, use_native

log = logging.getLogger(__name__)

# What an mlx-lm model directory needs; weights are *.safetensors.
_HF_PATTERNS = ["*.json", "*.safetensors", "*.py", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]


class ModelNotFoundError(ValueError):
    """The model spec is neither a local directory nor a reachable Hugging Face repository."""


def resolve_precision(precision: str = "auto") -> str:
    """The embedded default's precision for `precision`: auto is "stored" where quantized products
    are fast (a GPU, or the CPU with the native kernel routing them), else "float32": on the CPU,
    MLX's own quantized matmul is slower than its float32 path (docs/native.md)."""
    if precision != "auto":
        return precision
    if mx.default_device() != mx.cpu:
        return "stored"
    return "stored" if requested() is not False and native.load() is not None else "float32"


def resolve_model_path(spec: str | None, progress: ProgressFn | None = None, precision: str = "auto") -> Path:
    """Directory of the model: None -> the embedded default (converted at `precision`), a local
    path, or a HF id download."""
    if spec is None or spec in ("", "default"):
        return ensure_default_model(progress, resolve_precision(precision))
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} has no config.json; not an mlx-lm model directory")
        return path
    if path.exists():
        raise ModelNotFoundError(f"{path} is a file; pass the model directory")
    if not looks_like_hf_id(spec):
        raise ModelNotFoundError(f"'{spec}' is neither a local directory nor a Hugging Face id (org/name)")
    try:
        return download(spec, _HF_PATTERNS, what="model")
    except HubUnavailableError as exc:
        raise ModelNotFoundError(str(exc)) from exc


def prefer_float32_on_cpu(model: nn.Module) -> None:
    """Cast floating weights to float32 on the CPU device.

    On MLX's CPU backend only float32 matmuls reach the BLAS; fp16/bf16 run 40x slower. Quantized
    weights (uint32) stay quantized; only their scales and biases become float32.
    """
    if mx.default_device() == mx.cpu:
        model.set_dtype(mx.float32)


def weight_bytes(model) -> int:
    """Bytes of every array a loaded model holds (its parameters; a routed model's packed panels are
    parameters too)."""
    from mlx.utils import tree_flatten

    return sum(a.nbytes for _, a in tree_flatten(model.parameters()))


def load_target(spec: str | None, progress: ProgressFn | None = None, precision: str = "auto"):
    """Load (model, tokenizer, path) for `spec`, float32 on the CPU: through mlx-lm, or for a
    vision-language model through mlx-vlm (its language model; the vision half is dropped).
    `precision` picks the embedded default's weights (EngineConfig.precision)."""
    return load_target_with_vision(spec, progress, precision)[:3]


def load_target_with_vision(spec: str | None, progress: ProgressFn | None = None, precision: str = "auto"):
    """(model, tokenizer, path, Vision or None): `load_target` plus the image half of an mlx-vlm model."""
    from engine.loading.vlm import is_vlm_dir, load_vlm

    path = resolve_model_path(spec, progress, precision)
    if is_vlm_dir(path):
        model, tokenizer, vision = load_vlm(path)
        return model, tokenizer, path, vision
    from mlx_lm.utils import load

    model, tokenizer = load(str(path))
    prefer_float32_on_cpu(model)
    mx.eval(model.parameters())
    routed, line = use_native(model)  # DSPARK_NATIVE (docs/native.md)
    if line:
        (log.info if routed else log.warning)(line)
    return model, tokenizer, path, None
