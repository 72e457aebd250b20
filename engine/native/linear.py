"""The target's linear layers through the native panel kernel (docs/native.md), opt-in.

`DSPARK_NATIVE=1` routes every bias-free float32 `nn.Linear` of an mlx-lm target, and a tied
embedding's output product, through `packed_linear` when the extension is built and this CPU has
AVX2 and FMA; otherwise the target keeps MLX's path and one line says why. The weights are packed
once at load and the unpacked copy is dropped (a tied embedding keeps its table for the lookups, so
its packed head is the one extra copy).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from engine import backend, native


class PackedLinear(nn.Module):
    """x @ w.T for a bias-free float32 weight w [N, K], held packed in panels [P, K, 16]."""

    def __init__(self, weight: mx.array, ext) -> None:
        super().__init__()
        self.out_features = weight.shape[0]
        self.packed = native.pack_panels(weight)  # [P, K, 16]
        self._ext = ext

    def __call__(self, x: mx.array) -> mx.array:
        # The kernel's threads follow the BLAS's: the engine sets those per phase (decode rounds
        # may run at one thread, engine/costs.py).
        threads = backend.current_blas_threads() or 1
        return self._ext.packed_linear(x, self.packed, self.out_features, threads)


def requested() -> bool:
    """Whether DSPARK_NATIVE asks for the native kernel (1, on, true)."""
    return os.environ.get("DSPARK_NATIVE", "").strip().lower() in ("1", "on", "true", "yes")


def route_linears(model: nn.Module, ext, make: Callable[[mx.array, object], nn.Module] = PackedLinear) -> int:
    """Swap every bias-free float32 nn.Linear below `model` for ``make(weight, ext)`` (a PackedLinear
    unless a benchmark asks for another kernel), and a tied embedding's output product (`as_linear`)
    for one; returns how many products were routed."""
    routed = _swap(model, ext, make)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if getattr(model, "lm_head", None) is None and isinstance(embed, nn.Embedding) \
            and embed.weight.dtype == mx.float32:
        head = make(embed.weight, ext)
        embed.as_linear = lambda x: head(x)  # a function, so the embedding gains no child module
        routed += 1
    mx.eval(model.parameters())
    return routed


def use_native(model: nn.Module) -> tuple[bool, str | None]:
    """Route `model` through the kernel when DSPARK_NATIVE asks for it: (routed, the line to log;
    None when it was not asked for)."""
    if not requested():
        return False, None
    if mx.default_device() != mx.cpu:
        return False, "DSPARK_NATIVE: the native kernel is for the CPU; keeping MLX's path on this device"
    ext = native.load()
    if ext is None:
        return False, f"DSPARK_NATIVE: keeping MLX's path: {native.REASON}"
    count = route_linears(model, ext)
    return count > 0, f"native panel kernel ({ext.instruction_set()}): {count} linear products routed"


def _swap(module: nn.Module, ext, make: Callable[[mx.array, object], nn.Module]) -> int:
    count = 0
    for name, child in module.children().items():
        items = child if isinstance(child, list) else [child]
        for i, item in enumerate(items):
            if _plain_float32_linear(item):
                routed = make(item.weight, ext)
                if isinstance(child, list):
                    child[i] = routed
                else:
                    setattr(module, name, routed)
                count += 1
            elif isinstance(item, nn.Module):
                count += _swap(item, ext, make)
    return count


def _plain_float32_linear(module) -> bool:
    # nn.QuantizedLinear is not an nn.Linear subclass; biased layers keep MLX's path.
    return isinstance(module, nn.Linear) and "bias" not in module and module.weight.dtype == mx.float32
