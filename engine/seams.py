"""The engine's seams as Protocols: what the decoder needs from a drafter, and from a tokenizer.

`engine.models.drafter.Drafter` implements `DrafterLike` for both checkpoint layouts; test
oracles implement it to script drafts. The other drafter kind, `engine.lookup.LookupDrafter`,
reads no hidden states: it has a `kind` attribute, `config.max_drafts`, `has_confidence` and a
`make_cache()` that returns its per-request index (`drafter_kind` tells the kinds apart). Tokenizers come from mlx-lm (Hugging Face or GGUF); the
engine only calls what `TokenizerLike` lists.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import mlx.core as mx


class DrafterConfigLike(Protocol):
    """The drafter configuration fields the decoder and schedulers read."""

    block_size: int  # B: the anchor plus B - 1 mask slots per round
    mask_token_id: int
    sts_temperatures: list[float] | None  # per-draft-position confidence temperatures (None: 1.0)

    @property
    def max_drafts(self) -> int:
        """The most drafts one backbone pass can propose (the largest usable cap)."""
        ...


@runtime_checkable
class DrafterLike(Protocol):
    """A block drafter conditioned on the target's tapped hidden states (docs/method.md, "Drafters").

    It may also carry ``shortlist`` ([S] int32 token ids, or None), its draft vocabulary
    (docs/method.md §3.6); serving reads it with getattr, so a drafter without one needs nothing.
    """

    config: DrafterConfigLike
    has_markov: bool
    has_confidence: bool

    def make_cache(self) -> Any:
        """A fresh per-request context cache."""
        ...

    def context_length(self, cache: Any) -> int:
        """Context rows held by `cache`."""
        ...

    def backbone(self, ctx_new: mx.array | None, block_ids: mx.array, cache: Any) -> mx.array:
        """ctx_new [1, c, m*d] (appended to the cache), block_ids [1, B] -> hidden [1, B, d]."""
        ...

    def draft_hidden(self, h: mx.array) -> mx.array:
        """The rows of h [.., B, d] that draft, in draft order: [.., max_drafts, d]."""
        ...

    def base_logits(self, h: mx.array) -> mx.array:
        """Draft logits before the Markov bias: h [n, d] -> [n, V]."""
        ...

    def markov_bias(self, prev_ids: mx.array, h: mx.array | None = None) -> mx.array:
        """The Markov head's bias for the previous tokens prev_ids [n] (gated heads also read h [n, d]) -> [n, V]."""
        ...

    def confidence_logits(self, h: mx.array, prev_ids: mx.array) -> mx.array:
        """Pre-sigmoid confidence [n] that each draft survives verification."""
        ...


def drafter_kind(drafter: Any) -> str | None:
    """The kind of drafts a drafter proposes: "lookup", "dspark" or "dflash" (None: no drafter).

    Trained drafters are told apart by their checkpoint layout (z-lab's is DFlash); other kinds
    name themselves with a `kind` attribute.
    """
    if drafter is None:
        return None
    kind = getattr(drafter, "kind", None)
    if kind is not None:
        return kind
    return "dflash" if getattr(drafter.config, "layout", None) == "dflash" else "dspark"


class TokenizerLike(Protocol):
    """The tokenizer calls the engine makes (mlx-lm's TokenizerWrapper satisfies it)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str:
        """Text of token ids."""
        ...

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> Any:
        """The model's chat template rendered for messages."""
        ...
