"""Per-feature input scaling of the drafter's context projection, folded away at save time.

Small targets such as SmolLM2 have "massive activations": a few hidden dimensions of the tapped
layers run hundreds of times larger than the rest (RMS 450 against a median of 3). The context path
is ``hidden_norm(fc(taps))``; with fc initialised uniformly those few dimensions decide the context
vector at first, and Adam's per-step noise on their fc columns is about lr x 450. Training therefore
uses ``fc(taps * scale)`` with ``scale`` = 1 / RMS of each input feature (a diagonal
preconditioner). Measured on SmolLM2 at lr 8e-4 it left the first 150 steps unchanged within noise
(docs/drafter-runs/2026-12-03), so it is a safeguard, not the cure for slow drafter training.
Because fc is linear, ``fc.weight * scale`` is an ordinary fc weight: the saved checkpoint keeps its
layout and the engine loads it unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

from engine.models.drafter import Drafter

MODES = ("rms", "none")
STAT_SAMPLES = 64  # samples the per-feature RMS is measured on (deterministic: the first ones)
_FLOOR = 1e-3  # a feature whose RMS is below this (dead feature) is scaled as if it were this


class ScaledLinear(nn.Module):
    """y = (x * scale) @ weight.T with a frozen per-input ``scale`` [in]; ``weight`` [out, in] trains."""

    def __init__(self, weight: mx.array, scale: mx.array):
        super().__init__()
        self.weight = weight
        self.scale = scale
        self.freeze(keys=["scale"])

    def __call__(self, x: mx.array) -> mx.array:
        return (x * self.scale.astype(x.dtype)) @ self.weight.T.astype(x.dtype)

    def folded(self) -> nn.Linear:
        """The equivalent plain Linear (weight * scale), as the engine loads it."""
        plain = nn.Linear(self.weight.shape[1], self.weight.shape[0], bias=False)
        plain.weight = self.weight * self.scale[None, :]
        return plain


def feature_rms(batch_fn, num_samples: int) -> mx.array:
    """RMS of each tap feature [m*d] over the first ``num_samples`` samples, position 0 excluded.

    ``batch_fn(indices)`` returns (taps [b, W, m*d], hidden) zero-padded; padded rows are zeros, so
    they are excluded by counting only rows that are not all-zero. Position 0 (an attention sink with
    RMS ~1000 in SmolLM2) is left out so one row per sample does not set the scale.
    """
    total, rows = None, 0
    for start in range(0, num_samples, 4):
        taps, _ = batch_fn(list(range(start, min(start + 4, num_samples))))
        taps = taps[:, 1:].reshape(-1, taps.shape[-1])  # [b*(W-1), m*d]
        live = mx.any(taps != 0, axis=-1)  # [b*(W-1)] real rows
        sq = mx.sum(mx.where(live[:, None], taps * taps, 0.0), axis=0)  # [m*d]
        total = sq if total is None else total + sq
        rows += int(mx.sum(live).item())
    return mx.sqrt(total / max(rows, 1))


def apply(drafter: Drafter, mode: str, batch_fn, num_samples: int) -> mx.array | None:
    """Precondition ``drafter.fc`` in place per ``mode``; returns the scale [m*d] (None for "none")."""
    if mode not in MODES:
        raise ValueError(f"unknown tap scaling {mode!r}; choose one of {MODES}")
    if mode == "none" or num_samples < 1:
        return None
    scale = 1.0 / mx.maximum(feature_rms(batch_fn, num_samples), _FLOOR)  # [m*d]
    # The initial weight is kept: on unit-RMS inputs its uniform columns give every feature an equal
    # share of the context vector at step 0, instead of the few massive ones taking it all.
    drafter.fc = ScaledLinear(drafter.fc.weight, scale)
    mx.eval(drafter.fc.parameters())
    return scale


@contextmanager
def folded(drafter: Drafter):
    """Within the block ``drafter.fc`` is a plain Linear (weight * scale), as saved and served."""
    scaled = drafter.fc
    if not isinstance(scaled, ScaledLinear):
        yield drafter
        return
    drafter.fc = scaled.folded()
    try:
        yield drafter
    finally:
        drafter.fc = scaled
