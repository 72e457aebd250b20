"""Sliding-window caches roll back exactly, also once the window has moved on (engine/models/window_cache.py).

The unit test compares windowed attention through the cache, after appends and roll-backs of every
depth up to the margin, against attention computed from the whole history. The target test rolls a
tiny Gemma-4 back with the roll-back landing on the window edge and compares the next logits with
an uncached forward. Its negative control, a cache that keeps only the window as a ring buffer
does, fails the same comparison.
"""

import mlx.core as mx
import numpy as np
import pytest

from engine.models.target import trim_cache
from engine.models.window_cache import STEP, WindowKVCache
from tests.engine import tiny_gemma as tg

WINDOW, MARGIN, HEADS, DIM = 5, 3, 2, 4


def attend(q, k, v, mask):
    """q [1, h, n, d], k/v [1, h, m, d], mask [n, m] bool -> [1, h, n, d]."""
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask=mask)


def reference(q, history_k, history_v, start):
    """Attention of queries at positions start.. over the whole history, limited to the window."""
    n, total = q.shape[2], history_k.shape[2]
    qpos, kpos = np.arange(start, start + n)[:, None], np.arange(total)[None]
    mask = mx.array((kpos <= qpos) & (kpos > qpos - WINDOW))
    return attend(q, history_k, history_v, mask)


@pytest.mark.parametrize("seed", range(3))
def test_windowed_attention_after_roll_backs_equals_full_history(seed):
    rng = np.random.default_rng(seed)
    cache = WindowKVCache(WINDOW, MARGIN)
    hist_k = hist_v = None
    for _ in range(60):
        n = int(rng.integers(1, 5))
        q, k, v = (mx.array(rng.standard_normal((1, HEADS, n, DIM)).astype(np.float32)) for _ in range(3))
        mask = cache.make_mask(n)
        start = cache.offset
        ck, cv = cache.update_and_fetch(k, v)
        hist_k = k if hist_k is None else mx.concatenate([hist_k, k], axis=2)
        hist_v = v if hist_v is None else mx.concatenate([hist_v, v], axis=2)
        assert mx.allclose(attend(q, ck, cv, mask), reference(q, hist_k, hist_v, start), atol=1e-6)
        back = int(rng.integers(0, min(n, MARGIN) + 1))  # a round rolls back at most its own rows
        trim_cache([cache], back)
        hist_k, hist_v = hist_k[..., : cache.offset, :], hist_v[..., : cache.offset, :]
    assert cache.offset > 3 * WINDOW


def test_a_roll_back_deeper_than_the_margin_is_refused():
    cache = WindowKVCache(WINDOW, MARGIN)
    total = STEP + 2 * WINDOW  # past the first compaction
    for _ in range(total):
        cache.update_and_fetch(mx.zeros((1, 1, 1, 2)), mx.zeros((1, 1, 1, 2)))
    assert MARGIN <= cache.held - (WINDOW - 1) < STEP  # compacted, the margin kept
    with pytest.raises(ValueError, match="cannot roll back"):
        cache.trim(cache.held - (WINDOW - 1) + 1)
    fork = cache.fork()
    cache.trim(MARGIN)
    fork.update_and_fetch(mx.ones((1, 1, 2, 2)), mx.ones((1, 1, 2, 2)))
    assert (fork.offset, cache.offset) == (total + 2, total - MARGIN)


class RingLike(WindowKVCache):
    """Broken, as a ring buffer of the window is: after each append it keeps only the newest
    `window` positions, and a roll-back checks nothing."""

    def update_and_fetch(self, keys, values):
        out = super().update_and_fetch(keys, values)
        drop = max(0, self.held - self.window)
        pad = [(0, 0), (0, 0), (0, STEP), (0, 0)]
        self.keys = mx.pad(self.keys[..., drop:self.held, :], pad)
        self.values = mx.pad(self.values[..., drop:self.held, :], pad)
        self.held -= drop
        return out

    def trim(self, n):
        self.held, self.offset = max(0, self.held - n), self.offset - n
        return n


def roll_back_at_the_edge(cache_cls, model, target):
    """Max |logit difference| between cached and uncached next-token logits after rounds whose
    roll-back lands on the window edge, for every depth 1..margin."""
    worst = 0.0
    rng = np.random.default_rng(0)
    for depth in range(1, target.max_rollback + 1):
        cache = [cache_cls(c.window, c.margin) if isinstance(c, WindowKVCache) else c for c in target.make_cache()]
        committed = [int(t) for t in rng.integers(2, 280, size=3 * tg.WINDOW)]
        target.logits(mx.array([committed]), cache)
        # Draft so that the roll-back leaves the offset a multiple of the window: the edge.
        drafts = [int(t) for t in rng.integers(2, 280, size=depth)]
        keep_from = len(committed) - len(committed) % tg.WINDOW
        committed = committed[:keep_from] if keep_from else committed
        trim_cache(cache, 3 * tg.WINDOW - len(committed))
        target.logits(mx.array([drafts]), cache)
        trim_cache(cache, depth)  # every draft rejected
        nxt = int(rng.integers(2, 280))
        cached = target.logits(mx.array([[nxt]]), cache)[0, -1]
        cold = target.logits(mx.array([committed + [nxt]]))[0, -1]
        worst = max(worst, float(mx.abs(cached - cold).max()))
    return worst


def test_gemma_roll_back_on_the_window_edge_equals_an_uncached_forward():
    model = tg.tiny_gemma4(seed=1)
    target = tg.gemma_target(model, max_rollback=4)
    assert roll_back_at_the_edge(WindowKVCache, model, target) < 1e-4
    # Negative control: without the margin, the rows the next token needs are gone.
    assert roll_back_at_the_edge(RingLike, model, target) > 1e-2
