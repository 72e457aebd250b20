"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the context's end.

A drafter with no model and no training (docs/method.md §3.4). Its drafts for a round are the
tokens that followed the most recent earlier occurrence of the last n committed tokens, searched in
the prompt and the output so far, trying n = `max_ngram` first and down to `min_ngram`. Copy-heavy
requests (code edits that return the file, quoting, rewrites, revisions) repeat long runs of their
context, and those runs are drafted for free.

The index is updated as each token is committed and never rescans the context, so finding a match
costs a few dictionary look-ups at any context length (measured in docs/lookup.md). Drafts are a
function of the committed tokens alone, so their draft distribution is a point mass on each drafted
token, which every accept rule verifies losslessly (docs/method.md §5.6).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from engine.api import HistoryUsage
from engine.seams import drafter_kind

# A 1-token match drafts too often on text that does not copy (open chat lost 12% with it in the
# study behind docs/lookup.md), so the shortest match that drafts is 2 tokens by default.
DEFAULT_MIN_NGRAM = 2
DEFAULT_MAX_NGRAM = 3
# The largest cap `auto` may choose for lookup drafts (the study's adaptive cap ranged over 1..8).
DEFAULT_MAX_DRAFTS = 8


@dataclass(frozen=True)
class LookupConfig:
    """Settings of the lookup drafter, shared by every request."""

    min_ngram: int = DEFAULT_MIN_NGRAM  # shortest match that drafts
    max_ngram: int = DEFAULT_MAX_NGRAM  # longest match tried first
    max_drafts: int = DEFAULT_MAX_DRAFTS  # the most drafts a round may verify (the largest cap)

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"lookup n-gram sizes need 1 <= min ({self.min_ngram}) <= max ({self.max_ngram})")
        if self.max_drafts < 1:
            raise ValueError(f"lookup max_drafts must be >= 1, got {self.max_drafts}")


class NgramIndex:
    """Committed tokens with, per n, each n-gram's latest occurrence that is followed by a token.

    `_next[n][gram]` is the position right after the latest occurrence of `gram` that ends before
    the last token, i.e. where its continuation starts. The context's own final n-gram is entered
    only when the next token is committed, so a match always has at least one token to copy.
    """

    def __init__(self, min_ngram: int = DEFAULT_MIN_NGRAM, max_ngram: int = DEFAULT_MAX_NGRAM,
                 history: LookupHistory | None = None):
        self.tokens: list[int] = []
        self._next: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(max_ngram, min_ngram - 1, -1)}
        self._min = min_ngram
        # The first min_ngram - 1 tokens of every indexed min_ngram-gram: what `may_match_next` asks.
        self._heads: set[tuple[int, ...]] = set()
        self.history = history  # other requests' outputs, searched when this context has no match
        self.last_source: str | None = None  # where the last proposal came from: "context", "history", None

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens; O(number of n) per token, whatever the context length."""
        seq = self.tokens
        for token in tokens:
            end = len(seq)  # the n-grams ending just before `token` now have a continuation at `end`
            seq.append(token)
            for n, table in self._next.items():
                if end >= n:
                    table[tuple(seq[end - n : end])] = end
            if end >= self._min:
                self._heads.add(tuple(seq[end - self._min : end - 1]))

    def may_match_next(self) -> bool:
        """False only when the next round cannot find a match in this context, whatever token is
        committed next; lets a plain step queue the next one (docs/lookup.md, pipelining).

        Any match of length n >= min_ngram ends with a min_ngram-gram match, whose first tokens are
        the context's last min_ngram - 1. Committing the next token y also indexes the context's
        final min_ngram-gram, whose head is the same only when its tokens are all equal. A history
        of other requests is not checked: with one, a match is always possible."""
        seq, m = self.tokens, self._min
        if self.history is not None or m == 1:
            return True
        tail = tuple(seq[len(seq) - m + 1 :])
        return tail in self._heads or (len(seq) >= m and tuple(seq[-m:-1]) == tail)

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens copied after the latest earlier occurrence of the last n tokens,
        trying the longest n first; [] when no n-gram of a drafting size matches.

        A match in this request's own context is preferred at every n to one in the history of
        other requests' outputs (when there is one): the request's own text predicts it best."""
        self.last_source = None
        if limit <= 0:
            return []
        seq = self.tokens
        for n, table in self._next.items():
            start = table.get(tuple(seq[-n:])) if len(seq) >= n else None
            if start is not None:
                self.last_source = "context"
                return copy_from(seq, start, limit)
        if self.history is not None:
            out = self.history.propose(seq, limit)
            self.last_source = "history" if out else None
            return out
        return []

    def copy(self) -> NgramIndex:
        """An independent index over the same tokens (for `SpecDecoder.fork`)."""
        other = NgramIndex.__new__(NgramIndex)
        other.tokens = list(self.tokens)
        other._next = {n: dict(table) for n, table in self._next.items()}
        other._min, other._heads = self._min, set(self._heads)
        other.history, other.last_source = self.history, None  # the server-wide history is shared, not copied
        return other


def copy_from(seq: list[int], start: int, limit: int) -> list[int]:
    """`limit` tokens continuing `seq` as the copy of seq[start:] would.

    Past the end of `seq` the copy reads its own output, i.e. the run repeats with period
    len(seq) - start, as text that keeps copying itself does (a match near the end of the context
    otherwise drafts only a token or two).
    """
    out = seq[start : start + limit]
    period = len(seq) - start
    while len(out) < limit:
        out.append(out[len(out) - period])
    return out


class LookupDrafter:
    """The `lookup` drafter kind: settings shared by all requests; `make_cache` gives each request
    its own `NgramIndex`. It reads no target hidden states (no taps) and runs no model.

    With a `history` (`--lookup-history`), each request's index also searches the recent outputs of
    earlier requests when its own context has no match."""

    kind = "lookup"
    has_confidence = False  # no confidence head: schedulers use their acceptance estimates
    has_markov = False

    def __init__(self, config: LookupConfig = LookupConfig(), history: LookupHistory | None = None):
        self.config = config
        self.history = history

    def make_cache(self) -> NgramIndex:
        """A fresh per-request index (the decoder feeds it the prompt and every committed token)."""
        return NgramIndex(self.config.min_ngram, self.config.max_ngram, self.history)


# ---------------------------------------------------------------- lookup across requests

SEPARATOR = -1  # between requests' outputs in the history: no real token, so no n-gram spans two outputs


class LookupHistory:
    """A bounded n-gram index over this server's recent outputs (`--lookup-history TOKENS`).

    Outputs are appended whole, each after a separator, into one stream of at most `budget` tokens;
    the oldest tokens are evicted first. Tokens carry absolute positions (`_base` is the position of
    the oldest one held), and `_next[n][gram]` is where the continuation of the gram's latest
    occurrence starts, as in `NgramIndex`. Eviction is exact: evicting the token at position a
    deletes the entry of the n-gram that *starts* at a, if that entry still points at this
    occurrence (a later occurrence overwrote it otherwise). So every entry left has its whole
    n-gram and its continuation still held, no stale position is ever copied from, and the tables
    hold at most one entry per n per held token.

    Only the engine's one worker thread calls `add` and `propose`; `usage` (reported by /metrics)
    is updated in place after each `add`.
    """

    def __init__(self, budget: int, min_ngram: int = DEFAULT_MIN_NGRAM, max_ngram: int = DEFAULT_MAX_NGRAM):
        if budget < 1:
            raise ValueError(f"lookup history budget must be >= 1 token, got {budget}")
        self.budget = budget
        self._tokens = array("q")  # [held] token ids, SEPARATOR between outputs; absolute position _base + i
        self._base = 0
        self._next: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(max_ngram, min_ngram - 1, -1)}
        self.usage = HistoryUsage(budget_tokens=budget, tokens=0, approx_bytes=self._approx_bytes())

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, tokens: list[int]) -> None:
        """Append one request's output (after a separator), index its n-grams, then evict the
        oldest tokens beyond the budget."""
        if not tokens:
            return
        seq, start = self._tokens, self._base + len(self._tokens) + 1  # absolute position of tokens[0]
        seq.append(SEPARATOR)
        seq.extend(tokens)
        for n, table in self._next.items():
            # The grams ending before the output's last token: each has a continuation inside it.
            for end in range(start + n, start + len(tokens)):
                table[tuple(tokens[end - n - start : end - start])] = end
        self._evict(len(seq) - self.budget)
        self.usage.tokens, self.usage.approx_bytes = len(seq), self._approx_bytes()

    def _evict(self, count: int) -> None:
        """Drop the `count` oldest tokens and every entry whose n-gram starts at one of them."""
        if count <= 0:
            return
        seq, base = self._tokens, self._base
        for a in range(base, base + count):
            i = a - base
            for n, table in self._next.items():
                gram = tuple(seq[i : i + n])
                # Only this occurrence's own entry: a later occurrence of the gram keeps its entry.
                if len(gram) == n and table.get(gram) == a + n:
                    del table[gram]
        del seq[:count]
        self._base = base + count

    def propose(self, context: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest held occurrence of the context's last n
        tokens (longest n first), up to the end of that output; [] without a match."""
        if limit <= 0:
            return []
        seq, base = self._tokens, self._base
        for n, table in self._next.items():
            start = table.get(tuple(context[-n:])) if len(context) >= n else None
            if start is not None:
                out = []
                for token in seq[start - base : start - base + limit]:
                    if token == SEPARATOR:  # the end of that output: what followed it was another request
                        break
                    out.append(token)
                return out
        return []

    def _approx_bytes(self) -> int:
        """Approximate memory held: the token array, the dicts' tables and, per entry, its key
        tuple, the key's int objects and the position (CPython sizes; ids < 256 are shared ints,
        counted anyway: an upper estimate)."""
        int_size = sys.getsizeof(1 << 20)
        total = sys.getsizeof(self._tokens)
        for n, table in self._next.items():
            per_entry = sys.getsizeof((0,) * n) + n * int_size + int_size
            total += sys.getsizeof(table) + len(table) * per_entry
        return total


# ---------------------------------------------------------------- lookup beside a trained drafter


class HybridDrafter:
    """A trained drafter (DSpark or DFlash) and lookup, chosen per round (`--mode hybrid`).

    The decoder drafts each round with whichever `HybridScheduler` expects to commit more tokens
    per second; rounds where lookup drafts skip the trained drafter's pass. The trained drafter's
    context still gets every committed position's taps (docs/method.md §3.5)."""

    has_markov = False

    def __init__(self, trained, lookup: LookupDrafter):
        self.trained, self.lookup = trained, lookup
        self.kind = f"{drafter_kind(trained)}+lookup"  # "dspark+lookup" or "dflash+lookup"

    @property
    def config(self):
        """The trained drafter's config (its block, mask and `max_drafts`)."""
        return self.trained.config

    @property
    def has_confidence(self) -> bool:
        """Whether the trained drafter has a confidence head."""
        return self.trained.has_confidence


def split_drafter(drafter) -> tuple[object | None, LookupDrafter | None]:
    """(trained drafter or None, lookup drafter or None) of any drafter the decoder accepts."""
    if drafter is None:
        return None, None
    if isinstance(drafter, HybridDrafter):
        return drafter.trained, drafter.lookup
    if drafter_kind(drafter) == "lookup":
        return None, drafter
    return drafter, None
