"""Prefix cache across requests: later prompts start from the state an earlier request left behind.

Chat clients resend the whole conversation every turn and agents resend the same long system prompt,
so most of a prompt was already read by an earlier request. When a request ends (finished, stopped,
cancelled between rounds, or cancelled between prefill chunks), the decoder's committed state is
kept as a `PrefixState`: the tokens whose K/V the target cache holds, that cache, and the trained
drafter's matching context (its context cache plus the taps it has not absorbed yet). A new request
restores the longest common prefix of its prompt and a held state, and prefills only the rest
(docs/prefix-cache.md).

Only committed tokens are ever held: the decoder's caches hold exactly the committed tokens after
every round (rejected drafts are rolled back), and a state is taken only at a round boundary.
KV caches are plain mlx-lm `KVCache`s; restoring a shorter prefix is a fork plus a trim, so one
state serves every prefix of itself. States are evicted least recently used first, and the bytes
held never exceed the budget.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import logging
import os

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from engine.api import PrefixCacheUsage
from engine.models.target import Target, cache_length, fork_cache, trim_cache

log = logging.getLogger(__name__)

# The default budget: an eighth of physical memory, at most 4 GiB (about 90 K positions of the
# default model's fp32 K/V, or eleven full 8 K contexts).
DEFAULT_FRACTION, DEFAULT_MAX_BYTES = 8, 4 * 2**30
# Prefills shorter than this say more about fixed costs than about the per-token rate.
RATE_MIN_TOKENS = 64


@dataclass(frozen=True)
class PrefixState:
    """What a finished request leaves for later ones; every array is a compact copy owned here."""

    tokens: np.ndarray  # [T] int64: the tokens whose K/V `target` holds, positions 0..T-1
    target: list  # per target layer: a KVCache holding exactly T positions
    draft: list | None  # per drafter layer: a KVCache of the first c context positions (None: no trained drafter)
    pending: mx.array | None  # [1, T - c, m*d] taps of positions c..T-1 not absorbed yet (None: none)
    nbytes: int  # memory held by the arrays above

    def restore(self, length: int) -> tuple[list, list | None, mx.array | None]:
        """Fresh caches holding exactly the first `length` <= T positions: (target cache, drafter
        context cache, pending taps [1, length - c', m*d] or None). The held state is not changed:
        forks share its buffers until their first write, which copies (MLX arrays are immutable)."""
        target = [fork_cache(c) for c in self.target]
        trim_cache(target, len(self.tokens) - length)
        if self.draft is None:
            return target, None, None
        draft = [fork_cache(c) for c in self.draft]
        cached = cache_length(draft)
        if length <= cached:
            trim_cache(draft, cached - length)
            return target, draft, None
        return target, draft, self.pending[:, : length - cached]


def capture(tokens: list[int], target_cache: list, draft_cache: list | None, pending: mx.array | None) -> PrefixState:
    """A `PrefixState` of a decoder's caches (evaluated, compacted): `tokens` are the positions the
    target cache holds, and the drafter's context (cache + pending) must cover the same positions."""
    n = len(tokens)
    if cache_length(target_cache) != n:
        raise ValueError(f"target cache holds {cache_length(target_cache)} positions, tokens are {n}")
    target = [_compact(c) for c in target_cache]
    draft = [_compact(c) for c in draft_cache] if draft_cache is not None else None
    if pending is not None:
        pending = mx.contiguous(pending)
    if draft is not None:
        covered = cache_length(draft) + (0 if pending is None else pending.shape[1])
        if covered != n:
            raise ValueError(f"drafter context covers {covered} positions, tokens are {n}")
    arrays = [a for c in target + (draft or []) for a in (c.keys, c.values) if a is not None]
    if pending is not None:
        arrays.append(pending)
    mx.eval(*arrays)
    return PrefixState(np.asarray(tokens, dtype=np.int64), target, draft, pending, sum(a.nbytes for a in arrays))


def _compact(layer_cache):
    """A copy of one layer's KVCache whose arrays hold exactly its live positions (no step padding,
    no buffer shared with the live cache, so the bytes counted are the bytes held)."""
    copy = fork_cache(layer_cache)
    if copy.keys is not None:
        copy.keys, copy.values = mx.contiguous(copy.keys), mx.contiguous(copy.values)
    return copy


class PrefixCache:
    """Held `PrefixState`s, least recently used first, within `max_bytes`.

    Only the engine's worker thread calls `match` and `insert`; `usage` (read by /health and /metrics)
    is updated in place.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"prefix cache budget must be >= 1 byte, got {max_bytes}")
        self.max_bytes = max_bytes
        self._states: OrderedDict[int, PrefixState] = OrderedDict()  # id -> state, least recent first
        self._next_id = 0
        self.usage = PrefixCacheUsage(budget_bytes=max_bytes)
        self._read_tokens, self._read_s = 0, 0.0  # prefills of >= RATE_MIN_TOKENS tokens, for the estimate

    def __len__(self) -> int:
        return len(self._states)

    def match(self, prompt: list[int]) -> tuple[PrefixState, int] | None:
        """The held state sharing the longest prefix with `prompt`, and that length (at most
        len(prompt) - 1: the prompt's last token is always read, for its logits); None: no overlap.
        Counts the prompt's hit and miss tokens."""
        ids = np.asarray(prompt, dtype=np.int64)
        best, best_len = None, 0
        for key, state in reversed(self._states.items()):  # most recent first: it wins a tie
            n = _common_prefix(state.tokens, ids[:-1])
            if n > best_len:
                best, best_len = key, n
        self.usage.hit_tokens += best_len
        self.usage.miss_tokens += len(prompt) - best_len
        if best is None:
            return None
        self._states.move_to_end(best)
        return self._states[best], best_len

    def insert(self, state: PrefixState) -> None:
        """Hold `state` as the most recent one. A held state that is a prefix of it is dropped (this
        one restores it too); if a held state already extends it, that one is only refreshed. Least
        recently used states are evicted until the bytes fit; a state larger than the budget is not held."""
        if len(state.tokens) == 0:
            return
        for key, held in list(self._states.items()):
            n = _common_prefix(held.tokens, state.tokens)
            if n == len(state.tokens) and len(held.tokens) >= n:
                self._states.move_to_end(key)
                return
            if n == len(held.tokens):
                del self._states[key]
        if state.nbytes > self.max_bytes:
            self._update_usage()
            return
        self._states[self._next_id] = state
        self._next_id += 1
        while sum(s.nbytes for s in self._states.values()) > self.max_bytes:
            self._states.popitem(last=False)
            self.usage.evictions += 1
        self._update_usage()

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill read `tokens` prompt tokens in `seconds` (feeds `estimate_prefill_s`)."""
        if tokens >= RATE_MIN_TOKENS:
            self._read_tokens += tokens
            self._read_s += seconds

    def estimate_prefill_s(self, tokens: int) -> float:
        """Seconds a prefill of `tokens` tokens would take at the mean rate seen so far (0: none seen)."""
        return tokens * self._read_s / self._read_tokens if self._read_tokens else 0.0

    def clear(self) -> None:
        """Drop every held state."""
        self._states.clear()
        self._update_usage()

    def _update_usage(self) -> None:
        self.usage.entries = len(self._states)
        self.usage.tokens = sum(len(s.tokens) for s in self._states.values())
        self.usage.bytes = sum(s.nbytes for s in self._states.values())


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def prefix_cache_for(target: Target, max_bytes: int | None) -> PrefixCache | None:
    """A prefix cache of `max_bytes` (None: `default_prefix_cache_bytes()`) for `target`, or None: off
    (0 bytes), or the target keeps a cache that cannot be cut back to a prefix (sliding-window or
    recurrent layers), said once in the log."""
    if max_bytes is None:
        max_bytes = default_prefix_cache_bytes()
    if max_bytes <= 0:
        return None
    kinds = {type(c).__name__ for c in target.make_cache() if type(c) is not KVCache}
    if kinds:
        log.warning("prefix cache off: this model keeps %s caches, which cannot be cut back to a prefix",
                    ", ".join(sorted(kinds)))
        return None
    return PrefixCache(max_bytes)


def default_prefix_cache_bytes() -> int:
    """The serving default budget for this machine: physical memory / 8, at most 4 GiB."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 * 2**30
    return min(DEFAULT_MAX_BYTES, physical // DEFAULT_FRACTION)
