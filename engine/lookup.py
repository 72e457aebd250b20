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

from collections.abc import Iterable
from dataclasses import dataclass

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

    def __init__(self, min_ngram: int = DEFAULT_MIN_NGRAM, max_ngram: int = DEFAULT_MAX_NGRAM):
        self.tokens: list[int] = []
        self._next: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(max_ngram, min_ngram - 1, -1)}

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

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens copied after the latest earlier occurrence of the last n tokens,
        trying the longest n first; [] when no n-gram of a drafting size matches."""
        if limit <= 0:
            return []
        seq = self.tokens
        for n, table in self._next.items():
            start = table.get(tuple(seq[-n:])) if len(seq) >= n else None
            if start is not None:
                return copy_from(seq, start, limit)
        return []

    def copy(self) -> NgramIndex:
        """An independent index over the same tokens (for `SpecDecoder.fork`)."""
        other = NgramIndex.__new__(NgramIndex)
        other.tokens = list(self.tokens)
        other._next = {n: dict(table) for n, table in self._next.items()}
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
    its own `NgramIndex`. It reads no target hidden states (no taps) and runs no model."""

    kind = "lookup"
    has_confidence = False  # no confidence head: schedulers use their acceptance estimates
    has_markov = False

    def __init__(self, config: LookupConfig = LookupConfig()):
        self.config = config

    def make_cache(self) -> NgramIndex:
        """A fresh per-request index (the decoder feeds it the prompt and every committed token)."""
        return NgramIndex(self.config.min_ngram, self.config.max_ngram)
