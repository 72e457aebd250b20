"""A sliding-window layer's K/V cache that speculative rounds can roll back.

Sliding-window layers (Gemma, Mistral-style) normally keep a ring buffer of exactly `window`
positions (mlx-lm's and mlx-vlm's `RotatingKVCache`). Once it wraps, a rejected draft's row has
overwritten the oldest position the next token still needs, so the round cannot be undone. This
cache keeps `margin` positions more than the window needs, in temporal order, and masks attention
to the window itself: rolling back up to `margin` positions always leaves every position the next
query attends to. docs/method.md §1.4 has the argument.
"""

from __future__ import annotations

import mlx.core as mx

# Rows are dropped from the front in batches of this many, so the copy that compaction costs is paid
# once per STEP appended positions rather than once per step.
STEP = 256


class WindowKVCache:
    """K/V [1, heads, held, dim] of the positions [offset - held, offset), held <= window - 1 + margin
    once old rows are compacted away; queries attend to the `window` positions ending at their own."""

    def __init__(self, window: int, margin: int):
        if window < 1 or margin < 0:
            raise ValueError(f"window {window} and margin {margin} must be >= 1 and >= 0")
        self.window, self.margin = window, margin
        self.keys: mx.array | None = None  # [1, heads, capacity, dim]; rows >= held are unused
        self.values: mx.array | None = None
        self.offset = 0  # positions seen (the next position's index)
        self.held = 0  # live rows at the front of the buffers

    @property
    def keep(self) -> int:
        """Positions held after compaction: the window's past plus the roll-back margin."""
        return self.window - 1 + self.margin

    def _compact(self, incoming: int) -> None:
        """Drop rows older than `keep` when the buffer cannot take `incoming` more."""
        if self.keys is None or self.held + incoming <= self.keys.shape[2]:
            return
        drop = max(0, self.held - self.keep)
        live_k, live_v = self.keys[..., drop:self.held, :], self.values[..., drop:self.held, :]
        self.held -= drop
        room = self.held + incoming + STEP
        pad = [(0, 0), (0, 0), (0, room - self.held), (0, 0)]
        self.keys, self.values = mx.pad(live_k, pad), mx.pad(live_v, pad)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append keys/values [1, heads, n, dim]; return every held row (the mask limits the window)."""
        n = keys.shape[2]
        if self.keys is None:
            pad = [(0, 0), (0, 0), (0, STEP), (0, 0)]
            self.keys, self.values = mx.pad(keys, pad), mx.pad(values, pad)
        else:
            self._compact(n)
            self.keys[..., self.held:self.held + n, :] = keys
            self.values[..., self.held:self.held + n, :] = values
        self.held += n
        self.offset += n
        return self.keys[..., :self.held, :], self.values[..., :self.held, :]

    def _held_after_compaction(self, incoming: int) -> int:
        if self.keys is None or self.held + incoming <= self.keys.shape[2]:
            return self.held
        return min(self.held, self.keep)

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> mx.array:
        """Boolean [n, held + n] mask for the next `n` queries: causal, and at most `window` back."""
        window = window_size or self.window
        held = self._held_after_compaction(n)
        queries = mx.arange(self.offset, self.offset + n)[:, None]
        keys = mx.arange(self.offset - held, self.offset + n)[None]
        return (keys <= queries) & (keys > queries - window)

    def is_trimmable(self) -> bool:
        """Always: `trim` itself refuses a roll-back deeper than the margin."""
        return True

    def trim(self, n: int) -> int:
        """Forget the newest `n` positions (a rejected draft's rows)."""
        n = min(n, self.offset)
        needed = min(self.offset - n, self.window - 1)  # what the next query still attends to
        if self.held - n < needed:
            raise ValueError(f"cannot roll back {n} positions: the window cache holds {self.held} of "
                             f"{self.offset} (margin {self.margin})")
        self.held -= n
        self.offset -= n
        return n

    def fork(self) -> WindowKVCache:
        """An independent copy holding the same positions (arrays are immutable: no copy yet)."""
        copy = WindowKVCache(self.window, self.margin)
        if self.keys is not None:
            copy.keys, copy.values = self.keys[..., :self.held, :], self.values[..., :self.held, :]
        copy.offset, copy.held = self.offset, self.held
        return copy

    @property
    def state(self) -> tuple[mx.array | None, mx.array | None]:
        """The live K/V rows (for memory accounting and inspection)."""
        if self.keys is None:
            return None, None
        return self.keys[..., :self.held, :], self.values[..., :self.held, :]

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers."""
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def windowed(cache: list, margin: int) -> list:
    """`cache` with each ring-buffer (`RotatingKVCache`-like: `max_size`, `keep` == 0) layer replaced
    by a WindowKVCache of the same window and `margin` positions of roll-back room."""
    out = []
    for layer in cache:
        if hasattr(layer, "max_size") and getattr(layer, "keep", 0) == 0 and layer.offset == 0:
            layer = WindowKVCache(int(layer.max_size), margin)
        out.append(layer)
    return out
