"""Text side of the engine: streaming detokenization, stop strings, chat prompts.

Pure Python on purpose (no MLX, no server dependencies) so it can be unit-tested with an in-process
tokenizer. The tokenizer only needs `decode(ids, skip_special_tokens=...)` (and, for prompts,
`apply_chat_template`): a Hugging Face `PreTrainedTokenizerFast` or mlx-lm's `TokenizerWrapper`,
which forwards attributes to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

REPLACEMENT_CHAR = "\ufffd"

# A UTF-8 character is at most 4 bytes and a byte-level token carries at least one byte, so the
# unfinished character at the end of a decode lives in the last 3 tokens at most.
_MAX_PARTIAL_CHAR_TOKENS = 3

# Tokens we hold back while the decode keeps ending in U+FFFD. Valid UTF-8 never gets near this
# (see `_MAX_PARTIAL_CHAR_TOKENS`); only a model emitting invalid bytes or a long run of tokens that
# decode to nothing does. Past it we emit anyway, so the cost of `add` stays bounded.
_MAX_HELD_TOKENS = 16


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, never splitting a UTF-8 character.

    Decoding a token on its own is wrong for byte-level BPE (a character may span several tokens,
    and some tokenizers change a token's text depending on what precedes it), and re-decoding
    everything each round costs O(n). So we keep a short window `ids[prefix:]`:
    `ids[prefix:read]` is context that was already emitted, `ids[read:]` is new. Each round we
    decode the window and emit what lies beyond the context's text. A decode that ends in U+FFFD
    is an unfinished character and is held back until later tokens complete it.

    For byte-level BPE tokenizers, `"".join(deltas) + flush()` equals `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Only the window is kept: ids before `_prefix` are dropped once emitted.
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._parts: list[str] = []
        self._text_cache: str | None = ""

    @property
    def text(self) -> str:
        """Everything emitted so far (all deltas and flushes, concatenated)."""
        if self._text_cache is None:
            self._text_cache = "".join(self._parts)
        return self._text_cache

    def add(self, ids: Sequence[int]) -> str:
        """Append this round's token ids; return the text that is now safe to emit (maybe "")."""
        if not ids:
            return ""
        self._ids.extend(int(i) for i in ids)
        return self._record(self._advance())

    def flush(self) -> str:
        """At the end: emit whatever is held back, even an unfinished character (as U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        context = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        self._move_window(len(self._ids))
        return self._record(text[len(context):])

    def _advance(self) -> str:
        context = self._decode(self._prefix, self._read)
        end = len(self._ids)
        # Try the whole window first; if it ends mid-character, back off over the tokens that may
        # hold that character so the complete text before it is not delayed by a round.
        lowest_cut = max(self._read + 1, end - _MAX_PARTIAL_CHAR_TOKENS)
        for cut in range(end, lowest_cut - 1, -1):
            text = self._decode(self._prefix, cut)
            # Require new text: advancing past tokens that decode to "" (skipped special tokens)
            # would drop context that tokenizers which strip a leading space rely on.
            if len(text) > len(context) and not text.endswith(REPLACEMENT_CHAR):
                self._move_window(cut)
                return text[len(context):]
        if end - self._read > _MAX_HELD_TOKENS:
            # Not an unfinished character but invalid bytes (or nothing but empty tokens): give
            # up on holding so the window, and the cost of a round, stays bounded.
            text = self._decode(self._prefix, end)
            self._move_window(end)
            return text[len(context):]
        return ""

    def _move_window(self, cut: int) -> None:
        """Make the just-emitted tokens `ids[read:cut]` the context for the next round."""
        start = self._read
        self._ids = self._ids[start:]
        self._prefix, self._read = 0, cut - start

    def _decode(self, start: int, stop: int) -> str:
        if start >= stop:
            return ""
        return self._tokenizer.decode(
            self._ids[start:stop], skip_special_tokens=self._skip_special_tokens
        )

    def _record(self, delta: str) -> str:
        if delta:
            self._parts.append(delta)
            self._text_cache = None
        return delta


class StopMatcher:
    """Stop strings over a stream of text deltas, with hold-back.

    Text that could be the start of a stop string is held back until it is disambiguated, so a
    stop string spanning tokens or rounds is never emitted. The result does not depend on how the
    stream is chunked: the output is the text before the earliest-starting occurrence of any stop
    string (or all of it). That is why a complete match is itself held while an earlier-starting,
    longer stop string could still complete (stops ["abcd", "c"] on "abc").
    """

    def __init__(self, stops: Sequence[str]):
        # Empty strings would match everywhere; drop them (and duplicates).
        self._stops = tuple(dict.fromkeys(s for s in stops if s))
        self._max_len = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self._stopped = False
        self._matched: str | None = None  # the stop string `_earliest_match` found last

    @property
    def stopped(self) -> bool:
        """True once a stop string has matched (by `push`, or by `flush` at the very end)."""
        return self._stopped

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text (None while none has)."""
        return self._matched if self._stopped else None

    def push(self, delta: str) -> tuple[str, bool]:
        """Feed a text delta; return (text safe to emit now, whether a stop string matched)."""
        if self._stopped:
            return "", True
        if not self._stops:
            return delta, False
        buf = self._held + delta
        match = self._earliest_match(buf)
        pending = self._earliest_pending(buf)
        if match is not None and match <= pending:
            # No stop string starting earlier can still complete: this match is final.
            self._held = ""
            self._stopped = True
            return buf[:match], True
        self._held = buf[pending:]
        return buf[:pending], False

    def flush(self) -> str:
        """Release the held-back text at the end of generation (cut before a stop string in it)."""
        buf, self._held = self._held, ""
        if self._stopped:
            return ""
        match = self._earliest_match(buf)
        if match is not None:
            # A match was waiting for a longer, earlier stop string that never completed.
            self._stopped = True
            return buf[:match]
        return buf

    def _earliest_match(self, buf: str) -> int | None:
        """Where the earliest stop string starts in `buf` (None: nowhere); remembers which one it is
        (the first listed, when several start there)."""
        found = [(i, n) for n, i in enumerate(buf.find(s) for s in self._stops) if i >= 0]
        if not found:
            return None
        start, which = min(found)
        self._matched = self._stops[which]
        return start

    def _earliest_pending(self, buf: str) -> int:
        """Start of the longest suffix of `buf` that is a proper prefix of a stop, else len(buf)."""
        # A proper prefix is shorter than the longest stop, so only the tail can qualify.
        for start in range(max(0, len(buf) - self._max_len + 1), len(buf)):
            tail = buf[start:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self._stops):
                return start
        return len(buf)


def apply_chat_template(
    tokenizer,
    messages: list[dict],
    add_generation_prompt: bool = True,
    **template_kwargs,
) -> list[int]:
    """Token ids of the chat prompt for `messages`, rendered by the tokenizer's chat template.

    Extra keyword arguments (`tools`, `enable_thinking`, ...) go to the template. Raises ValueError
    if the tokenizer has no chat template. Always returns a plain list of ints, whatever container
    the installed transformers returns (list, BatchEncoding, nested batch of one, array).
    """
    if not _has_chat_template(tokenizer):
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no chat template; chat requests need a "
            "model whose tokenizer_config.json (or chat_template.jinja) defines one"
        )
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, **template_kwargs
    )
    return _as_id_list(out)


def _has_chat_template(tokenizer) -> bool:
    # mlx-lm's TokenizerWrapper also counts a custom template function or renderer as a template.
    flag = getattr(tokenizer, "has_chat_template", None)
    if isinstance(flag, bool):
        return flag
    return bool(getattr(tokenizer, "chat_template", None))


def _as_id_list(out) -> list[int]:
    # transformers 5 returns a BatchEncoding by default (return_dict=True); we don't pass
    # return_dict=False because custom template functions (mlx-lm) may not accept it.
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if isinstance(out, str):
        raise TypeError("apply_chat_template returned text although tokenize=True was requested")
    out = list(out)
    if out and isinstance(out[0], (list, tuple)):
        if len(out) != 1:
            raise ValueError(f"expected one tokenized conversation, got a batch of {len(out)}")
        out = list(out[0])
    return [int(i) for i in out]
