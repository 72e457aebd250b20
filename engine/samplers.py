"""One request's sampler: the target draw, the draft draw and the accept rule, chosen once.

`make_sampler` picks greedy, rejection or seed-stable sampling from the request's settings, so a
round and a plain step never branch on the sampler's name. Every method takes logits that already
went through the request's logit processors (`engine/processors.py`); the sampler applies the
temperature and truncation (`sampling.process_logits`) itself, identically for drafter and target.

Positions are absolute token positions; `anchor` is the position of the round's anchor token, so a
round's drafts sit at anchor + 1, anchor + 2, ...
"""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx

from engine import sampling
from engine.api import SamplerName
from engine.sampling import SamplerSettings

# Counter streams of the request's seed, so draft, accept and plain draws never share noise.
STREAM_TARGET, STREAM_DRAFT, STREAM_ACCEPT = 11, 12, 13


class Sampler(Protocol):
    """What a round and a plain step need from the sampling rule."""

    settings: SamplerSettings

    def target_token(self, logits: mx.array, position: int) -> mx.array:
        """The plain draw of the token at `position` from processed target logits [V], lazy (not evaluated)."""
        ...

    def draft_token(self, logits: mx.array, position: int) -> tuple[int, mx.array | None]:
        """A draft for `position` from draft logits [V]: (token, log q [V]) or (token, None) when the
        accept rule does not need q."""
        ...

    def point_mass(self, draft_ids: list[int], vocab: int) -> mx.array | None:
        """log q [l, V] for drafts fixed by the context (prompt lookup): a point mass on each draft,
        or None when the accept rule does not need q."""
        ...

    def accept(self, draft_ids: list[int], draft_logprobs: mx.array | None, target_logits: mx.array,
               anchor: int) -> tuple[int, int]:
        """(number of drafts accepted, next token) from the verify pass's processed rows [l+1, V]."""
        ...


class GreedySampler:
    """Argmax everywhere; accept while each draft is the target's argmax."""

    def __init__(self, settings: SamplerSettings):
        self.settings = settings

    def target_token(self, logits: mx.array, position: int) -> mx.array:
        """The argmax of logits [V], lazy."""
        return mx.argmax(logits)

    def draft_token(self, logits: mx.array, position: int) -> tuple[int, None]:
        """The argmax draft; greedy verification needs no q."""
        return mx.argmax(logits).item(), None

    def point_mass(self, draft_ids: list[int], vocab: int) -> None:
        """Greedy verification needs no q: a fixed draft is accepted iff it is the argmax."""
        return None

    def accept(self, draft_ids, draft_logprobs, target_logits, anchor):
        """Greedy verification (raw logits suffice)."""
        return sampling.greedy_accept(draft_ids, target_logits)


class RejectionSampler:
    """Independent draws keyed by (seed, stream, position); the Leviathan/Chen accept rule."""

    def __init__(self, settings: SamplerSettings, seed: int):
        self.settings, self.seed = settings, seed

    def target_token(self, logits: mx.array, position: int) -> mx.array:
        """A categorical draw from the processed distribution, lazy."""
        logp = sampling.process_logits(logits, self.settings)  # [V]
        return sampling.categorical_token(logp, sampling.mix_key(self.seed, STREAM_TARGET, position))

    def draft_token(self, logits: mx.array, position: int) -> tuple[int, mx.array]:
        """A draft drawn from q, with log q for the accept rule."""
        return sampling.sample_draft(logits, self.settings, sampling.mix_key(self.seed, STREAM_DRAFT, position))

    def point_mass(self, draft_ids: list[int], vocab: int) -> mx.array:
        """One-hot log q [l, V]: the accept rule then keeps x with probability p(x) and recovers from p
        with x removed (docs/method.md §5.6)."""
        return sampling.point_mass_logprobs(draft_ids, vocab)

    def accept(self, draft_ids, draft_logprobs, target_logits, anchor):
        """Accept with min(1, p/q); recover from the residual or draw the bonus from p."""
        logp = sampling.process_logits(target_logits, self.settings)  # [l+1, V]
        key = sampling.mix_key(self.seed, STREAM_ACCEPT, anchor)
        return sampling.rejection_accept(draft_ids, draft_logprobs, logp, key)


class SeedStableSampler:
    """Gumbel-max with noise fixed by (seed, position): a seed gives the same text at any draft length."""

    def __init__(self, settings: SamplerSettings, seed: int):
        self.settings, self.seed = settings, seed

    def target_token(self, logits: mx.array, position: int) -> mx.array:
        """The Gumbel-max draw for `position`, lazy."""
        logp = sampling.process_logits(logits, self.settings)  # [V]
        return sampling.seed_stable_token(logp, self.seed, position)

    def draft_token(self, logits: mx.array, position: int) -> tuple[int, None]:
        """The draft with the target's noise for `position`; the accept rule needs no q."""
        return sampling.seed_stable_draft(logits, self.settings, self.seed, position), None

    def point_mass(self, draft_ids: list[int], vocab: int) -> None:
        """Seed-stable verification takes any draft as is and needs no q."""
        return None

    def accept(self, draft_ids, draft_logprobs, target_logits, anchor):
        """Accept while each draft equals the target's seed-stable token."""
        logp = sampling.process_logits(target_logits, self.settings)  # [l+1, V]
        return sampling.seed_stable_accept(draft_ids, logp, self.seed, anchor + 1)


def make_sampler(settings: SamplerSettings, name: SamplerName, seed: int) -> Sampler:
    """The sampler for a request: greedy when the settings are, else the named lossless rule."""
    if settings.greedy:
        return GreedySampler(settings)
    if name == "seed-stable":
        return SeedStableSampler(settings, seed)
    if name == "rejection":
        return RejectionSampler(settings, seed)
    raise ValueError(f"unknown sampler {name!r}")
