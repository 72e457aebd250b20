"""The target's linear layers through the native panel kernels (docs/native.md).

On the CPU, when the extension is built and this CPU has AVX2, FMA and F16C, every bias-free
affine 4- or 8-bit `nn.QuantizedLinear` of an mlx-lm target goes through `quantized_linear` (MLX's
own CPU quantized matmul is several times slower), and with `DSPARK_NATIVE=1` every bias-free
float32 `nn.Linear` goes through `packed_linear` too (opt-in); a tied embedding's output product
goes through the one that fits. `DSPARK_NATIVE=0` routes nothing. Where the kernel cannot run, the
target keeps MLX's path and one line says why. The weights are packed once at load and the
unpacked copy is dropped (a tied float32 embedding keeps its table for the lookups, so its packed
head is the one extra copy; a tied quantized one is held only as panels).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from engine import native
from engine.native.attention import route_attention


class PackedLinear(nn.Module):
    """x @ w.T for a bias-free float32 weight w [N, K], held packed in panels [P, K, 16]."""

    def __init__(self, weight: mx.array, ext) -> None:
        super().__init__()
        self.out_features = weight.shape[0]
        self.packed = native.pack_panels(weight)  # [P, K, 16]
        self._ext = ext

    def __call__(self, x: mx.array) -> mx.array:
        return self._ext.packed_linear(x, self.packed, self.out_features, native.kernel_threads())


class QuantizedPanelLinear(nn.Module):
    """x @ w.T for an MLX affine-quantized weight (4 or 8 bits, float16-exact scales and biases),
    held in quantized panels (`pack_quantized`): codes [P, K * bits / 8, 16], scales and biases
    [P, K / group_size, 16]."""

    def __init__(self, layer: nn.Module, ext) -> None:
        super().__init__()
        self.out_features = layer.weight.shape[0]
        self.bits, self.group_size = layer.bits, layer.group_size
        self.codes, self.scales, self.biases = native.pack_quantized(
            layer.weight, layer.scales, layer.biases, layer.bits, layer.group_size)
        self._ext = ext

    def __call__(self, x: mx.array) -> mx.array:
        return self._ext.quantized_linear(x, self.codes, self.scales, self.biases, self.out_features,
                                          self.bits, self.group_size, native.kernel_threads())


class QuantizedPanelEmbedding(nn.Module):
    """A tied affine-quantized embedding held only as quantized panels (`QuantizedPanelLinear`):
    lookups gather and dequantize their rows from the panels, and `as_linear` is the panel product,
    so the table is not kept twice (the 8-bit SmolLM2 table is about 32 MB)."""

    def __init__(self, embed: nn.Module, ext) -> None:
        super().__init__()
        self.head = QuantizedPanelLinear(embed, ext)
        self.num_embeddings = self.head.out_features

    def __call__(self, ids: mx.array) -> mx.array:
        head = self.head
        return native.quantized_rows(head.codes, head.scales, head.biases, head.bits, head.group_size, ids)  # [..., K]

    def as_linear(self, x: mx.array) -> mx.array:
        return self.head(x)


def requested() -> bool | None:
    """What DSPARK_NATIVE asks for: True (1, on, true, yes: every product the kernels take), False
    (0, off, false, no: none), None (unset or anything else: the quantized products only)."""
    setting = os.environ.get("DSPARK_NATIVE", "").strip().lower()
    if setting in ("1", "on", "true", "yes"):
        return True
    return False if setting in ("0", "off", "false", "no") else None


def route_linears(model: nn.Module, ext, make: Callable[[mx.array, object], nn.Module] = PackedLinear,
                  quantized_only: bool = False) -> int:
    """Swap every bias-free float32 nn.Linear below `model` for ``make(weight, ext)`` (a PackedLinear
    unless a benchmark asks for another kernel), every packable nn.QuantizedLinear for a
    QuantizedPanelLinear, and a tied embedding's output product (`as_linear`) for the one that
    fits; `quantized_only`: leave the float32 ones alone. Returns how many products were routed."""
    routed = _swap(model, ext, None if quantized_only else make)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if getattr(model, "lm_head", None) is None and embed is not None:
        if isinstance(embed, nn.Embedding) and embed.weight.dtype == mx.float32 and not quantized_only:
            head = make(embed.weight, ext)
            embed.as_linear = lambda x: head(x)  # a function, so the embedding gains no child module
            routed += 1
        elif _packable_quantized(embed, nn.QuantizedEmbedding):
            inner.embed_tokens = QuantizedPanelEmbedding(embed, ext)  # the table's one copy
            routed += 1
    mx.eval(model.parameters())
    return routed


def use_native(model: nn.Module) -> tuple[bool, str | None]:
    """Route `model` through the kernels as DSPARK_NATIVE asks (`requested`): (routed, the line to
    log; None when nothing was asked for and nothing routed).

    Unset, only quantized products are routed, and only on the CPU: there MLX's own quantized
    matmul is several times slower than the kernel (docs/native.md), while float32 products stay on
    MLX's path, whose numbers the reference tests were made with."""
    asked = requested()
    if asked is False or (asked is None and not _has_quantized(model)):
        return False, None
    if mx.default_device() != mx.cpu:
        return False, None if asked is None else \
            "DSPARK_NATIVE: the native kernel is for the CPU; keeping MLX's path on this device"
    ext = native.load()
    if ext is None:
        return False, f"native kernel: keeping MLX's path: {native.REASON}"
    count = route_linears(model, ext, quantized_only=asked is None)
    if not count:
        return False, f"native panel kernel ({ext.instruction_set()}): 0 linear products routed"
    from engine.native.layer import route_layers  # layer.py builds on this module's classes

    layers = route_attention(model, ext)
    fused = route_layers(model, ext)
    return True, (f"native panel kernel ({ext.instruction_set()}): {count} linear products routed, "
                  f"attention of {layers} layers, {fused} layers in three calls")


def _has_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())


def _swap(module: nn.Module, ext, make: Callable[[mx.array, object], nn.Module] | None) -> int:
    """Route the linears below `module` (float32 ones through `make`, unless it is None)."""
    count = 0
    for name, child in module.children().items():
        items = child if isinstance(child, list) else [child]
        for i, item in enumerate(items):
            routed = make(item.weight, ext) if make is not None and _plain_float32_linear(item) else \
                QuantizedPanelLinear(item, ext) if _packable_quantized(item, nn.QuantizedLinear) else None
            if routed is not None:
                if isinstance(child, list):
                    child[i] = routed
                else:
                    setattr(module, name, routed)
                count += 1
            elif isinstance(item, nn.Module):
                count += _swap(item, ext, make)
    return count


def _packable_quantized(module, kind: type) -> bool:
    # The kernel takes MLX's affine 4- and 8-bit layouts with float16 scales and biases; values
    # another dtype cannot hold exactly keep MLX's path rather than change the model.
    if not isinstance(module, kind) or "bias" in module or getattr(module, "mode", "affine") != "affine" \
            or module.bits not in (4, 8) or module.group_size % 2:
        return False
    return all(mx.array_equal(a.astype(mx.float16).astype(a.dtype), a).item() for a in (module.scales, module.biases))


def _plain_float32_linear(module) -> bool:
    # nn.QuantizedLinear is not an nn.Linear subclass; biased layers keep MLX's path.
    return isinstance(module, nn.Linear) and "bias" not in module and module.weight.dtype == mx.float32
