"""Target-side logit processors: logit bias, repetition, presence and frequency penalties.

They act on RAW logits [..., V], before `sampling.process_logits` (temperature, top-k, top-p,
min-p), in this order:

1. logit bias (OpenAI `logit_bias`): logit[t] += bias[t], each bias clamped to [-100, 100].
2. repetition penalty r (HF / vLLM rule): for every token t seen in the prompt or in the generated
   text, a positive logit is divided by r and a non-positive one multiplied by r.
3. presence and frequency penalties (OpenAI rule): logit[t] -= presence * [count_t > 0]
   + frequency * count_t, where count_t counts t in the GENERATED text only (as vLLM does: the
   prompt does not count).

History. "Generated" means the tokens the decoder has committed after the prompt, plus, for a row
that scores a position further ahead, the uncommitted tokens before that position:

* verify row k (the target's distribution after drafts[:k]): committed + drafts[:k]
  (`LogitProcessor.apply_rows`, vectorised through `draft_history`);
* draft k of a round: committed + the k - 1 drafts sampled before it;
* a queued plain step: committed + the still-lazy token it continues.

Plain decoding would see exactly these histories at those positions, which is what keeps
speculative decoding lossless with processors on. Rolled-back drafts never enter the committed
history (`commit` receives only the committed tokens).

4. a grammar (`engine/grammar.py`), last: every token the grammar does not allow after the same
   history goes to -inf, so no bias or penalty can bring it back. Its state is the committed tokens
   plus the uncommitted ones before the row, exactly like the penalties' history; it needs their
   values, so a plain step is not queued ahead of the token it continues (`reads_tokens`).

With every setting at its default and no grammar `LogitProcessor` holds no arrays and every method
returns at once, so the default decode path pays nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from engine.grammar import GrammarMatcher, mask_logits

# OpenAI accepts logit_bias values in [-100, 100]; -100 effectively bans a token.
MAX_LOGIT_BIAS = 100.0


@dataclass(frozen=True)
class ProcessorSettings:
    """Per-request penalties and logit bias; the defaults switch every processor off."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off; must be > 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); the last entry of an id wins

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def uses_history(self) -> bool:
        """True when a penalty depends on the tokens seen so far."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def active(self) -> bool:
        """True when any processor changes the logits."""
        return self.uses_history or any(bias != 0.0 for _, bias in self.logit_bias)


class LogitProcessor:
    """One request's processors and token history, as MLX arrays over the vocabulary.

    `counts` [V] counts the generated (committed) tokens; `seen` [V] marks prompt + generated.
    `grammar` holds the grammar's state after the committed tokens (None: no grammar).
    """

    def __init__(self, settings: ProcessorSettings, vocab: int, grammar: GrammarMatcher | None = None):
        self.settings, self.vocab, self.grammar = settings, vocab, grammar
        self._penalties = settings.active
        self.active = settings.active or grammar is not None
        self.counts: mx.array | None = None  # [V] float32
        self.seen: mx.array | None = None  # [V] bool
        self.bias: mx.array | None = None  # [V] float32
        if self._penalties:
            self.counts = mx.zeros((vocab,), dtype=mx.float32)
            self.seen = mx.zeros((vocab,), dtype=mx.bool_)
            self.bias = dense_bias(settings.logit_bias, vocab)

    @property
    def reads_tokens(self) -> bool:
        """True when a row's processing needs the values of the tokens before it (a grammar), so a
        step cannot be queued from a token that is still lazy."""
        return self.grammar is not None

    def add_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Mark the prompt's tokens as seen (repetition penalty only; they are not counted)."""
        if self.settings.uses_history and len(prompt_ids):
            self.seen = self.seen | (token_counts(prompt_ids, self.vocab) > 0)

    def commit(self, tokens: Sequence[int]) -> None:
        """Add committed generated tokens to the history (lazy: evaluated with the next row)."""
        if self.settings.uses_history and len(tokens):
            added = token_counts(tokens, self.vocab)  # [V]
            self.counts = self.counts + added
            self.seen = self.seen | (added > 0)
        if self.grammar is not None:
            self.grammar.commit(tokens)

    def apply(self, logits: mx.array, extra: Sequence[int] | mx.array | None = None) -> mx.array:
        """Process logits [..., V] whose rows all continue the committed history plus `extra`.

        `extra` [m] are generated tokens not committed yet (drafts, a queued plain step's lazy
        token); they may be a lazy array (only without a grammar), so a pipelined step stays
        pipelined.
        """
        if not self.active:
            return logits
        x = logits
        if self._penalties:
            counts, seen = self.counts, self.seen
            if extra is not None and len(extra) and self.settings.uses_history:
                added = token_counts(extra, self.vocab)  # [V]
                counts, seen = counts + added, seen | (added > 0)
            x = penalize(x, counts, seen, self.settings, self.bias)
        if self.grammar is not None:
            x = mask_logits(x, self.grammar.allowed(() if extra is None else extra))
        return x

    def apply_rows(self, logits: mx.array, drafts: Sequence[int]) -> mx.array:
        """Process verify rows [l+1, V]: row k continues the committed history plus drafts[:k]."""
        if not self.active:
            return logits
        x = logits
        if self._penalties and not self.settings.uses_history:
            x = penalize(x, self.counts, self.seen, self.settings, self.bias)
        elif self._penalties:
            prefix = draft_history(mx.array(list(drafts), dtype=mx.int32), self.vocab)  # [l+1, V]
            x = penalize(x, self.counts + prefix, self.seen | (prefix > 0), self.settings, self.bias)
        if self.grammar is not None:
            x = mask_logits(x, self.grammar.allowed_rows(drafts))
        return x


def token_counts(ids: Sequence[int] | mx.array, vocab: int) -> mx.array:
    """How often each token occurs in ids [m]: counts [V] float32."""
    ids = ids if isinstance(ids, mx.array) else mx.array(list(ids), dtype=mx.int32)
    return mx.zeros((vocab,), dtype=mx.float32).at[ids.reshape(-1)].add(1.0)


def draft_history(drafts: mx.array, vocab: int) -> mx.array:
    """Counts [l+1, V] of drafts[:k] in row k (row 0 is all zeros), for drafts [l].

    The one seam that gives verify rows their draft prefixes (a test breaks it on purpose).
    """
    one_hot = (drafts[:, None] == mx.arange(vocab)).astype(mx.float32)  # [l, V]
    zero = mx.zeros((1, vocab), dtype=mx.float32)  # [1, V]
    return mx.concatenate([zero, mx.cumsum(one_hot, axis=0)], axis=0)  # [l+1, V]


def dense_bias(logit_bias: tuple[tuple[int, float], ...], vocab: int) -> mx.array | None:
    """The bias as a dense [V] float32 row (clamped to +-MAX_LOGIT_BIAS); None when there is none."""
    by_id = {int(t): max(-MAX_LOGIT_BIAS, min(MAX_LOGIT_BIAS, float(b))) for t, b in logit_bias}
    if any(not 0 <= t < vocab for t in by_id):  # a scatter out of range would write anywhere
        raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
    by_id = {t: b for t, b in by_id.items() if b != 0.0}
    if not by_id:
        return None
    ids = mx.array(list(by_id), dtype=mx.int32)  # [b]
    return mx.zeros((vocab,), dtype=mx.float32).at[ids].add(mx.array(list(by_id.values())))


def penalize(logits: mx.array, counts: mx.array, seen: mx.array, s: ProcessorSettings,
             bias: mx.array | None) -> mx.array:
    """Bias, then repetition, then presence/frequency on logits [..., V].

    `counts` (generated-token counts) and `seen` (prompt + generated) broadcast against logits.
    """
    x = logits if bias is None else logits + bias  # [..., V]
    if s.repetition_penalty != 1.0:
        r = s.repetition_penalty
        x = mx.where(seen, mx.where(x > 0, x / r, x * r), x)
    if s.presence_penalty != 0.0:
        x = x - s.presence_penalty * (counts > 0).astype(x.dtype)
    if s.frequency_penalty != 0.0:
        x = x - s.frequency_penalty * counts.astype(x.dtype)
    return x
