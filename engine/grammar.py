"""Constrained decoding: which tokens a JSON schema, regex or Lark grammar allows next.

The matching is llguidance's (a maintained Rust engine with rollback, docs/structured-output.md
says why it and not xgrammar). This module compiles a request's `GrammarSpec` once (cached by its
text), builds llguidance's view of our tokenizer once per runtime, and turns the matcher's bitmasks
into boolean rows over the model's vocabulary for `engine/processors.py`, which masks every row a
distribution is formed from (drafts, verify rows, plain steps), each with the grammar state plain
constrained decoding would have at that position. That is what keeps speculative decoding exact
under a grammar (docs/method.md §5.7).

The matcher only ever holds committed tokens: masks for positions further ahead (drafts, verify
rows) advance it along the uncommitted tokens and roll it back before returning.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
import mlx.core as mx
import numpy as np

from engine.api import EngineInputError, GrammarSpec, SpecStats

_COMPILERS = {
    "json_schema": llguidance.LLMatcher.grammar_from_json_schema,
    "regex": llguidance.LLMatcher.grammar_from_regex,
    "lark": llguidance.LLMatcher.grammar_from_lark,
}
_WHAT = {"json_schema": "JSON schema", "regex": "regular expression", "lark": "grammar"}


@functools.lru_cache(maxsize=256)
def compile_grammar(spec: GrammarSpec) -> str:
    """llguidance's grammar text for `spec`, checked; raises EngineInputError naming what it cannot serve.

    Needs no tokenizer, so requests are refused before they are queued (engine/client.py)."""
    what = _WHAT[spec.kind]
    try:
        grammar = _COMPILERS[spec.kind](spec.source)
    except (ValueError, TypeError) as exc:  # malformed text: llguidance raises at once
        raise EngineInputError(f"The {what} cannot be served: {_first_line(exc)}", param=spec.param) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise EngineInputError(f"The {what} cannot be served: {_first_line(messages[0])}", param=spec.param)
    return grammar


def _first_line(message: object) -> str:
    """llguidance's message without its source excerpt (a regex error spans several lines)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    tail = next((line for line in reversed(lines) if line.startswith("error:")), "")
    return f"{lines[0]} ({tail.removeprefix('error:').strip()})" if tail and tail != lines[0] else lines[0]


def grammar_tokenizer(tokenizer, vocab: int, eos_ids: Sequence[int]) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face fast tokenizer (or mlx-lm's wrapper of one): every token's
    bytes, with `eos_ids` as the tokens a finished grammar allows. Takes about a second: build once."""
    text = _tokenizer_json(tokenizer)
    if text is None:
        raise EngineInputError("Structured output needs a fast (Rust) tokenizer, which this model does not "
                               "have.", param="response_format")
    return llguidance.LLTokenizer(text, n_vocab=vocab, eos_token=sorted(eos_ids))


def _tokenizer_json(tokenizer) -> str | None:
    """The `tokenizers` JSON of an mlx-lm wrapper, a transformers fast tokenizer or a `tokenizers`
    Tokenizer (each wraps the next in its `_tokenizer` or `backend_tokenizer`); None if none is fast."""
    seen = 0
    while tokenizer is not None and seen < 4:
        if type(tokenizer).__module__.startswith("tokenizers"):
            return tokenizer.to_str()
        backend = getattr(tokenizer, "backend_tokenizer", None)
        tokenizer = backend if backend is not None else getattr(tokenizer, "_tokenizer", None)
        seen += 1
    return None


@dataclass(frozen=True)
class CompiledGrammar:
    """A checked grammar bound to a tokenizer; `matcher()` starts one decoder's matcher."""

    tokenizer: llguidance.LLTokenizer
    grammar: str
    vocab: int  # the model's logit width; the tokenizer's vocabulary may be larger or smaller

    def matcher(self, stats: SpecStats | None = None) -> GrammarMatcher:
        """A fresh matcher at the grammar's start (one per decoder), counting its masks into `stats`."""
        return GrammarMatcher(self, stats)


class GrammarMatcher:
    """One decoder's grammar state: the committed tokens so far, and masks for positions ahead."""

    def __init__(self, compiled: CompiledGrammar, stats: SpecStats | None = None):
        self.vocab, self._stats = compiled.vocab, stats
        self._matcher = llguidance.LLMatcher(compiled.tokenizer, compiled.grammar)
        if self._matcher.is_error():
            raise EngineInputError(f"The grammar cannot be served: {self._matcher.get_error()}")
        self._words = (compiled.tokenizer.vocab_size + 31) // 32  # int32 words per bitmask row
        self._eos = frozenset(compiled.tokenizer.eos_tokens)
        # Token t's bit is bit t % 32 of word t // 32; a logit column past the tokenizer's words reads
        # the zero word appended at index W (never allowed).
        ids = np.arange(self.vocab)
        self._word = mx.array(np.minimum(ids >> 5, self._words))  # [V]
        self._bit = mx.array((ids & 31).astype(np.uint32))  # [V]

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance past committed tokens (each was drawn from a masked row, so the grammar allows it).

        An end token ends the output, so nothing after it matters and it is not fed to the matcher
        (llguidance refuses it once the grammar has stopped, though its mask allowed it)."""
        t0 = time.perf_counter()
        tokens = self._before_end(tokens)
        if tokens and not self._matcher.consume_tokens(tokens):
            raise RuntimeError(f"grammar matcher refused committed tokens: {self._matcher.get_error()}")
        self._count(0, t0)

    def allowed(self, ahead: Sequence[int] = ()) -> mx.array:
        """Allowed tokens [V] bool after the committed tokens plus `ahead` (uncommitted drafts, each
        drawn from a masked row; a row after an end token is never used and gets the current mask)."""
        t0 = time.perf_counter()
        ahead = self._before_end(ahead)
        consumed = self._matcher.try_consume_tokens(ahead)
        bits = np.empty((1, self._words), dtype=np.int32)  # [1, W]
        if consumed == len(ahead):
            self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        self._matcher.rollback(consumed)
        if consumed != len(ahead):
            raise RuntimeError("grammar matcher: a draft drawn from a masked row is not allowed")
        return self._unpack(bits, t0)[0]

    def allowed_rows(self, drafts: Sequence[int]) -> mx.array:
        """Allowed tokens [l+1, V] bool for the verify rows: row k after the committed tokens plus
        drafts[:k]. Drafts need not be allowed (prompt lookup copies them from the context): rows
        after the first disallowed draft, or after an end token, can never be used and repeat the
        last row that can."""
        t0 = time.perf_counter()
        drafts = list(drafts)
        bits = np.empty((len(drafts) + 1, self._words), dtype=np.int32)  # [l+1, W]
        self._matcher.unsafe_compute_mask_ptr_with_draft_token(bits.ctypes.data, self._words * 4, drafts)
        usable = self._matcher.validate_tokens(self._before_end(drafts)) + 1
        bits[usable:] = bits[usable - 1]
        return self._unpack(bits, t0)

    def _before_end(self, tokens: Sequence[int]) -> list[int]:
        """`tokens` up to their first end token."""
        tokens = list(tokens)
        end = next((i for i, t in enumerate(tokens) if t in self._eos), len(tokens))
        return tokens[:end]

    def _unpack(self, bits: np.ndarray, t0: float) -> mx.array:
        """Bitmask rows [r, W] int32 as [r, V] bool, expanded lazily inside the MLX graph (so it runs
        with the forward it masks, not here); the rows and the time since `t0` are counted."""
        padded = np.zeros((bits.shape[0], self._words + 1), dtype=np.uint32)  # [r, W + 1]
        padded[:, : self._words] = bits.view(np.uint32)
        allowed = ((mx.array(padded)[:, self._word] >> self._bit) & 1).astype(mx.bool_)  # [r, V]
        self._count(bits.shape[0], t0)
        return allowed

    def _count(self, rows: int, t0: float) -> None:
        """Add mask rows and the matcher time since `t0` to the request's stats."""
        if self._stats is not None:
            self._stats.grammar_masks += rows
            self._stats.time_grammar_s += time.perf_counter() - t0


def mask_logits(logits: mx.array, allowed: mx.array) -> mx.array:
    """Logits [..., V] with every token the grammar does not allow at -inf (allowed broadcasts)."""
    return mx.where(allowed, logits, mx.array(float("-inf"), dtype=logits.dtype))
