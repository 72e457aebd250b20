"""Target wrapper over an mlx-lm model: logits plus the drafter's tapped hidden states.

The drafter is conditioned on the raw outputs of a few target decoder layers. mlx-lm models run
their layers from a Python list (`model.layers`), so we swap each tapped entry for a pass-through
module that records its output. Every mlx-lm architecture then works unchanged (llama, qwen3,
gemma...), and a one-time check proves the tapped forward reproduces the model's own logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from engine.models.window_cache import windowed
from engine.native import attention as native_attention

if TYPE_CHECKING:
    from engine.vision import PromptInputs

# Positions a round may roll back, at least: the largest cap plus the bonus row. Sliding-window
# layers keep this many positions beyond their window (engine/models/window_cache.py).
DEFAULT_MAX_ROLLBACK = 32


class _Tap(nn.Module):
    """Wraps one decoder layer and records its output into a shared list."""

    def __init__(self, inner: nn.Module, sink: list):
        super().__init__()
        self.inner = inner
        self._sink = sink  # a list attribute is not a parameter (not an mx.array/Module)

    def __getattr__(self, key: str):
        # Architectures read layer attributes (e.g. `use_sliding` in make_cache): defer to the layer.
        try:
            return super().__getattr__(key)
        except AttributeError:
            if "inner" not in self:
                raise
            return getattr(self["inner"], key)

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        # mlx-vlm's Gemma-4 layers return (hidden, shared K/V, offset); the hidden state is first.
        self._sink.append(out[0] if isinstance(out, tuple) else out)
        return out


class TapError(RuntimeError):
    """The tapped forward does not reproduce the model or a tap did not fire."""


class Target:
    """The verified model. `forward` returns logits and the concatenated tap outputs.

    `model` is an mlx-lm model, or the language model of an mlx-vlm one (its forward returns an
    output object with `.logits`). `max_rollback` is the most positions a round may take back: the
    runtime raises it to the drafter's largest cap plus one."""

    def __init__(self, model: nn.Module, tap_layer_ids: tuple[int, ...] = (), max_rollback: int = DEFAULT_MAX_ROLLBACK):
        self.model = model
        self.max_rollback = max_rollback
        self.num_layers = len(model.layers)
        self.tap_layer_ids = tuple(tap_layer_ids)
        for lid in self.tap_layer_ids:
            if not 0 <= lid < self.num_layers:
                raise TapError(f"tap layer {lid} outside the target's {self.num_layers} layers")
        self._sink: list[mx.array] = []
        # Unwrap taps a Target built earlier over the same model left in place: each layer is tapped once.
        for lid, layer in enumerate(model.layers):
            if isinstance(layer, _Tap):
                model.layers[lid] = layer["inner"]
        self._originals = {lid: model.layers[lid] for lid in self.tap_layer_ids}
        self._install()

    def _install(self) -> None:
        for lid, layer in self._originals.items():
            self.model.layers[lid] = _Tap(layer, self._sink)

    def _uninstall(self) -> None:
        for lid, layer in self._originals.items():
            self.model.layers[lid] = layer

    def make_cache(self) -> list:
        """A fresh per-layer KV cache for this target; sliding-window layers keep `max_rollback`
        positions beyond their window so that any round can be rolled back."""
        return windowed(make_prompt_cache(self.model), self.max_rollback)

    def logits(self, ids: mx.array, cache: list | None = None, inputs: PromptInputs | None = None) -> mx.array:
        """ids [b, n] -> logits [b, n, V] float32, no taps (cache None: an uncached forward)."""
        with native_attention.active(self.model):
            if inputs is None:
                out = self.model(ids, cache=cache)
            else:
                out = self.model(ids, cache=cache, inputs_embeds=inputs.embeds, **inputs.extra)
        return getattr(out, "logits", out).astype(mx.float32)

    def forward(self, ids: mx.array, cache: list, taps: bool = True,
                inputs: PromptInputs | None = None) -> tuple[mx.array, mx.array | None]:
        """ids [1, n] -> (logits [1, n, V] float32, taps [1, n, m*d] or None without taps).

        `taps=False` skips building the taps (None), for drafters that read no hidden states.
        `inputs`: the embeddings (and other model inputs) of these n positions, for a prompt with
        images (engine/vision.py); the ids then only label the positions."""
        self._sink.clear()
        logits = self.logits(ids, cache, inputs)
        if not taps:
            self._sink.clear()  # the layers' outputs stay internal to the forward: nothing concatenated
            return logits, None
        return logits, self._collect_taps()

    def forward_hidden(self, ids: mx.array, cache: list | None = None) -> tuple[mx.array, mx.array | None]:
        """ids [b, n] -> (final post-norm hidden [b, n, d] float32, taps [b, n, m*d] or None).

        For drafter training: `lm_head(hidden)` gives the logits, so a feature cache can store the
        hidden state [n, d] instead of logits [n, V]. Needs an mlx-lm model with an inner ``.model``.
        """
        inner = getattr(self.model, "model", None)
        if inner is None:
            raise TapError(f"{type(self.model).__name__} has no inner .model to read the final hidden state from")
        self._sink.clear()
        with native_attention.active(self.model):
            hidden = inner(ids, cache=cache).astype(mx.float32)
        return hidden, self._collect_taps()

    def _collect_taps(self) -> mx.array | None:
        if not self.tap_layer_ids:
            return None
        if len(self._sink) != len(self.tap_layer_ids):
            raise TapError(f"expected {len(self.tap_layer_ids)} tap outputs, got {len(self._sink)}")
        # Taps fire in layer order; the drafter expects them in target_layer_ids order.
        order = sorted(range(len(self.tap_layer_ids)), key=lambda i: self.tap_layer_ids[i])
        by_layer = dict(zip([self.tap_layer_ids[i] for i in order], self._sink))
        taps = mx.concatenate([by_layer[lid] for lid in self.tap_layer_ids], axis=-1)
        self._sink.clear()
        return taps.astype(mx.float32)

    def check_taps(self, probe_ids: list[int] | None = None) -> None:
        """Once per load: tapped logits equal the unwrapped model's logits on a probe input."""
        ids = mx.array([probe_ids or [1, 2, 3, 4, 5, 6, 7, 8]])
        tapped, taps = self.forward(ids, self.make_cache())
        self._uninstall()
        try:
            plain = self.logits(ids, self.make_cache())
        finally:
            self._install()
        if not mx.array_equal(tapped, plain):
            raise TapError("tapped forward changed the target's logits")
        if taps is not None and taps.shape[:2] != ids.shape:
            raise TapError(f"tap shape {taps.shape} does not match input {ids.shape}")

    @property
    def vocab_size(self) -> int:
        """Rows of the output distribution."""
        emb = self.embedding
        rows = getattr(emb, "num_embeddings", None)  # an embedding held as panels has no weight matrix
        return int(rows if rows is not None else emb.weight.shape[0])

    @property
    def embedding(self) -> nn.Module:
        """The token embedding module (z-lab DFlash drafters borrow it)."""
        inner = getattr(self.model, "model", None) or getattr(self.model, "language_model", None)
        emb = getattr(inner, "embed_tokens", None)
        if emb is None:
            raise TapError("cannot find the target's embed_tokens")
        return emb

    def lm_head(self, h: mx.array) -> mx.array:
        """Target output projection for hidden states h [..., d] -> logits [..., V] (with Gemma's
        logit soft-cap: mlx-vlm language models apply it in `logits_from_hidden`)."""
        from_hidden = getattr(self.model, "logits_from_hidden", None)
        if from_hidden is not None:
            return from_hidden(h)
        head = getattr(self.model, "lm_head", None)
        if head is not None:
            return head(h)
        return self.embedding.as_linear(h)


def cache_length(cache: list) -> int:
    """Tokens held by a per-layer KV cache (all layers agree)."""
    return int(cache[0].offset)


def trim_cache(cache: list, num_tokens: int) -> None:
    """Drop the newest `num_tokens` entries from every layer (speculative roll-back)."""
    if num_tokens <= 0:
        return
    for layer_cache in cache:
        if not layer_cache.is_trimmable():
            raise ValueError(f"{type(layer_cache).__name__} cannot be rolled back")
        layer_cache.trim(num_tokens)


def fork_cache(layer_cache):
    """An independent copy of one layer's KV cache holding the same tokens.

    Caches with their own `fork` (the window cache) copy themselves. Slicing to the live length copies nothing yet (MLX arrays are immutable; the next update
    writes a new buffer), so a fork is cheap and never sees the original's later tokens.
    """
    if hasattr(layer_cache, "fork"):
        return layer_cache.fork()
    copy = type(layer_cache)()
    n = layer_cache.offset
    if layer_cache.keys is not None:
        copy.keys, copy.values = layer_cache.keys[..., :n, :], layer_cache.values[..., :n, :]
    copy.offset = n
    return copy
