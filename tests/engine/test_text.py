"""Tests for engine.text: streaming detokenizer, stop strings, chat template.

A real byte-level BPE tokenizer is trained in-process (milliseconds), small enough that accented
letters, CJK and emoji are split across several tokens, which is exactly what the detokenizer must
survive.
"""

from __future__ import annotations

import random

import pytest

from engine.text import IncrementalDetokenizer, StopMatcher, apply_chat_template

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

REPL = "\ufffd"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog. Stop here, then continue.",
    "Héllo wörld, naïve café, crème brûlée, façade, jalapeño, Ærøskøbing.",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストです。東京は大きな都市です。",
    "한국어 문장도 조금 있습니다.",
    "Ελληνικά γράμματα και русский текст тоже здесь.",
    "Emoji: 😀 🎉 👍🏽 🚀 ❤️ 👨‍👩‍👧 🇫🇷 — mixed with text.",
    "def add(a, b):\n    return a + b  # code, too\n",
]
# Characters the random texts are drawn from: ASCII plus 2-, 3- and 4-byte UTF-8, including emoji
# that never occur in the corpus (so they stay split into single-byte tokens) and ZWJ sequences.
CHAR_POOL = (
    list("abcdefghij klmnop.,!?\n")
    + list("éüñçøß")
    + list("你好世界日本語한국")
    + ["😀", "🎉", "🦀", "🧪", "👍🏽", "👨‍👩‍👧", "🇫🇷", "\u200d"]
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIALS,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS_LINES * 30, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", clean_up_tokenization_spaces=False
    )
    hf.chat_template = CHATML
    return hf


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(CHAR_POOL) for _ in range(n))


def random_rounds(rng: random.Random, ids: list[int], max_round: int = 6) -> list[list[int]]:
    """Split ids into consecutive rounds of 0..max_round ids (empty rounds included)."""
    rounds, i = [], 0
    while i < len(ids):
        n = rng.randint(0, max_round)
        rounds.append(ids[i : i + n])
        i += n
    return rounds


def stream(tokenizer, rounds, skip_special_tokens=True):
    """Run the detokenizer over rounds; return (deltas, flush() output, detokenizer)."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    deltas = [detok.add(r) for r in rounds]
    return deltas, detok.flush(), detok


def reference_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Text before the earliest-starting occurrence of any (non-empty) stop string."""
    found = [text.find(s) for s in stops if s and s in text]
    return (text[: min(found)], True) if found else (text, False)


def run_stop(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = []
    for chunk in chunks:
        emitted, stopped = matcher.push(chunk)
        out.append(emitted)
        if stopped:
            assert matcher.push("more") == ("", True)
            return "".join(out), True
    out.append(matcher.flush())
    return "".join(out), matcher.stopped


def random_chunks(rng: random.Random, text: str, max_len: int = 5) -> list[str]:
    chunks, i = [], 0
    while i < len(text):
        n = rng.randint(0, max_len)
        chunks.append(text[i : i + n])
        i += n
    return chunks


# --- tokenizer sanity -------------------------------------------------------------------------


def test_tokenizer_splits_multibyte_chars(tokenizer):
    """The test tokenizer really splits emoji/CJK bytes across tokens (else tests prove nothing)."""
    ids = tokenizer.encode("🦀 你好 👨‍👩‍👧", add_special_tokens=False)
    assert sum(REPL in tokenizer.decode([i]) for i in ids) >= 4
    assert tokenizer.decode(ids) == "🦀 你好 👨‍👩‍👧"


# --- IncrementalDetokenizer -------------------------------------------------------------------


def test_one_token_at_a_time_matches_decode(tokenizer):
    """Feeding one id per round reproduces decode(all) and never emits a partial character."""
    text = "Héllo 🦀 wörld 你好 👨‍👩‍👧 🇫🇷!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, tail, detok = stream(tokenizer, [[i] for i in ids])
    assert "".join(deltas) + tail == text
    assert detok.text == text
    assert not any(REPL in d for d in deltas)
    assert tail == ""


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_rounds_concatenate_to_decode(tokenizer, skip_special_tokens):
    """For many random texts and random round splits, deltas + flush == decode(all ids)."""
    rng = random.Random(1234 + skip_special_tokens)
    special_ids = tokenizer.convert_tokens_to_ids(SPECIALS)
    for _ in range(300):
        ids = tokenizer.encode(random_text(rng, rng.randint(0, 40)), add_special_tokens=False)
        for _ in range(rng.randint(0, 3)):  # sprinkle special tokens, even mid-character
            ids.insert(rng.randint(0, len(ids)), rng.choice(special_ids))
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        deltas, tail, detok = stream(tokenizer, random_rounds(rng, ids), skip_special_tokens)
        assert "".join(deltas) + tail == expected
        assert detok.text == expected


def test_no_replacement_char_in_deltas_for_valid_text(tokenizer):
    """When the final text has no U+FFFD, no delta (and no flush) contains one either."""
    rng = random.Random(99)
    for _ in range(300):
        text = random_text(rng, rng.randint(1, 40))
        ids = tokenizer.encode(text, add_special_tokens=False)
        deltas, tail, _ = stream(tokenizer, random_rounds(rng, ids, max_round=3))
        assert REPL not in "".join(deltas) + tail
        assert "".join(deltas) + tail == text


def test_random_ids_including_invalid_utf8(tokenizer):
    """Arbitrary id streams (invalid byte sequences too) still concatenate to decode(all)."""
    rng = random.Random(7)
    vocab = len(tokenizer)
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 30))]
        expected = tokenizer.decode(ids, skip_special_tokens=True)
        deltas, tail, _ = stream(tokenizer, random_rounds(rng, ids))
        assert "".join(deltas) + tail == expected


def test_partial_character_is_held_then_released(tokenizer):
    """A round ending mid-emoji emits the text before it now, and the emoji once complete."""
    ids = tokenizer.encode("ok 🦀", add_special_tokens=False)
    crab = tokenizer.encode(" 🦀", add_special_tokens=False)
    assert len(crab) >= 3 and ids[-len(crab):] == crab
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.add(ids[:-1]) == "ok"  # text before the unfinished emoji is not delayed
    assert detok.add(ids[-1:]) == " 🦀"
    assert detok.flush() == ""


def test_flush_releases_unfinished_character(tokenizer):
    """flush() emits a held-back unfinished character (as U+FFFD), matching decode(all)."""
    crab = tokenizer.encode("🦀", add_special_tokens=False)
    ids = tokenizer.encode("hi", add_special_tokens=False) + crab[:2]
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.add(ids) == "hi"
    tail = detok.flush()
    assert REPL in tail
    assert detok.text == tokenizer.decode(ids)
    assert detok.flush() == ""


def test_window_stays_short(tokenizer):
    """Each add decodes only a short window, not the whole history (cost does not grow)."""

    class CountingTokenizer:
        def __init__(self, inner):
            self.inner, self.longest = inner, 0

        def decode(self, ids, skip_special_tokens=True):
            self.longest = max(self.longest, len(ids))
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    counting = CountingTokenizer(tokenizer)
    text = "Héllo wörld 你好 🦀 " * 200
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(counting)
    out = "".join(detok.add(ids[i : i + 2]) for i in range(0, len(ids), 2)) + detok.flush()
    assert out == text
    assert len(ids) > 1000 and counting.longest <= 12


def test_garbage_bytes_do_not_grow_window(tokenizer):
    """An endless run of invalid UTF-8 bytes is eventually emitted instead of held forever."""
    continuation = tokenizer.convert_tokens_to_ids("Ģ")  # byte-level symbol for byte 0x80
    assert tokenizer.decode([continuation]) == REPL
    detok = IncrementalDetokenizer(tokenizer)
    out = "".join(detok.add([continuation]) for _ in range(100))
    assert len(out) >= 80  # emitted along the way, not only at flush
    assert out + detok.flush() == tokenizer.decode([continuation] * 100)


def test_leading_space_stripping_tokenizer():
    """A SentencePiece-style (Metaspace) tokenizer keeps its spaces, even around skipped tokens."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()  # strips the space of the first token of every decode
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "</s>"], show_progress=False
    )
    sentence = "Hello world, the quick brown fox jumps over the lazy dog."
    tok.train_from_iterator([sentence] * 30, trainer)
    sp = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")
    rng = random.Random(3)
    words = "Hello world the quick brown fox lazy dog".split()
    for _ in range(200):
        ids = sp.encode(" ".join(rng.sample(words, rng.randint(1, 6))), add_special_tokens=False)
        for _ in range(rng.randint(0, 2)):
            ids.insert(rng.randint(0, len(ids)), sp.eos_token_id)
        deltas, tail, _ = stream(sp, random_rounds(rng, ids, max_round=3))
        assert "".join(deltas) + tail == sp.decode(ids, skip_special_tokens=True)


# --- StopMatcher ------------------------------------------------------------------------------


def test_stop_equal_to_whole_delta():
    """A delta that is exactly the stop string emits nothing and stops."""
    m = StopMatcher(["STOP"])
    assert m.push("STOP") == ("", True)
    assert m.stopped


def test_stop_split_across_three_pushes():
    """A stop string arriving in three pieces is held back and never emitted."""
    m = StopMatcher(["<end>"])
    assert m.push("hi <e") == ("hi ", False)
    assert m.push("n") == ("", False)
    assert m.push("d> tail") == ("", True)


def test_text_before_match_in_same_delta_is_emitted():
    """Text preceding the stop string in the same delta is emitted; text after it is dropped."""
    assert StopMatcher(["##"]).push("abc##def") == ("abc", True)


def test_overlapping_candidates():
    """Stops ["ab", "bc"] on "abc" stop at "ab" and emit nothing, however the text is chunked."""
    assert StopMatcher(["ab", "bc"]).push("abc") == ("", True)
    m = StopMatcher(["ab", "bc"])
    assert m.push("a") == ("", False)
    assert m.push("bc") == ("", True)


def test_earliest_occurrence_wins():
    """Among several stops, the one that starts first in the text wins, not the first listed."""
    assert StopMatcher(["zz", "yy", "b"]).push("a b yy zz") == ("a ", True)


def test_longer_earlier_stop_beats_shorter_later_one():
    """A complete later match waits while an earlier-starting stop may still complete."""
    m = StopMatcher(["abcd", "c"])
    assert m.push("xabc") == ("x", False)
    assert m.push("d") == ("", True)
    m = StopMatcher(["abcd", "c"])
    assert m.push("xabc") == ("x", False)
    assert m.push("e") == ("ab", True)


def test_empty_stop_list_passes_through():
    """With no stop strings every delta is emitted unchanged, with no hold-back."""
    for stops in ([], [""], ["", ""]):
        m = StopMatcher(stops)
        assert m.push("<e") == ("<e", False)
        assert m.push("") == ("", False)
        assert m.flush() == ""


def test_empty_strings_in_stops_are_ignored():
    """An empty string among real stops neither matches everywhere nor breaks matching."""
    m = StopMatcher(["", "END"])
    assert m.push("abc E") == ("abc ", False)
    assert m.push("ND") == ("", True)


def test_incomplete_stop_is_released_by_flush():
    """A prefix of a stop string that never completes is released at flush."""
    m = StopMatcher(["</answer>"])
    assert m.push("done </ans") == ("done ", False)
    assert m.flush() == "</ans"
    assert not m.stopped


def test_false_start_is_released_when_disambiguated():
    """Held text is released as soon as the next delta shows it is not a stop string."""
    m = StopMatcher(["\nUser:"])
    assert m.push("a\nUs") == ("a", False)
    assert m.push("ed it") == ("\nUsed it", False)


def test_flush_applies_waiting_match():
    """A match still waiting on a longer earlier stop is cut at flush, and reports stopped."""
    m = StopMatcher(["abcd", "c"])
    assert m.push("abc") == ("", False)
    assert m.flush() == "ab"
    assert m.stopped


def test_stop_matcher_random_property():
    """For random text, stops and chunking, output == text before earliest stop (or all of it)."""
    rng = random.Random(2024)
    alphabet = "abc"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
            for _ in range(rng.randint(0, 3))
        ]
        expected = reference_stop(text, stops)
        assert run_stop(stops, random_chunks(rng, text)) == expected, (text, stops)


# --- pipeline and chat template ---------------------------------------------------------------


def test_detokenizer_into_stop_matcher(tokenizer):
    """Detokenizer deltas piped into the stop matcher give decode(all) cut at the stop string."""
    rng = random.Random(5)
    stops = ["世界", "🦀!", "\nUser:"]
    for _ in range(200):
        pieces = [random_text(rng, rng.randint(0, 8)) for _ in range(3)]
        text = rng.choice(stops).join(pieces) if rng.random() < 0.7 else "".join(pieces)
        ids = tokenizer.encode(text, add_special_tokens=False)
        detok, matcher = IncrementalDetokenizer(tokenizer), StopMatcher(stops)
        out, stopped = [], False
        for round_ids in random_rounds(rng, ids):
            emitted, stopped = matcher.push(detok.add(round_ids))
            out.append(emitted)
            assert REPL not in emitted
            if stopped:
                break
        if not stopped:
            out.append(matcher.push(detok.flush())[0])
            out.append(matcher.flush())
            stopped = matcher.stopped
        final = tokenizer.decode(ids, skip_special_tokens=True)
        assert ("".join(out), stopped) == reference_stop(final, stops)


def test_apply_chat_template_returns_ids(tokenizer):
    """apply_chat_template returns a plain list[int] that decodes to the ChatML prompt."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Héllo 🦀"},
    ]
    ids = apply_chat_template(tokenizer, messages)
    assert type(ids) is list and ids and all(type(i) is int for i in ids)
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHéllo 🦀<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = apply_chat_template(tokenizer, messages, add_generation_prompt=False)
    assert ids[: len(without)] == without and len(ids) > len(without)


def test_apply_chat_template_refuses_tokenizer_without_template(tokenizer):
    """A tokenizer without a chat template raises a ValueError that says so."""
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    assert not bare.chat_template
    with pytest.raises(ValueError, match="chat template"):
        apply_chat_template(bare, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "returned",
    [[1, 2, 3], (1, 2, 3), [[1, 2, 3]], {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}],
)
def test_apply_chat_template_normalizes_return_types(returned):
    """Lists, tuples, a batch of one and a dict/BatchEncoding all become a plain list[int]."""

    class FakeTokenizer:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, **kwargs):
            assert kwargs["tokenize"] is True and kwargs["enable_thinking"] is False
            return returned

    ids = apply_chat_template(FakeTokenizer(), [], enable_thinking=False)
    assert ids == [1, 2, 3] and type(ids) is list


def test_mlx_lm_tokenizer_wrapper(tokenizer):
    """mlx-lm's TokenizerWrapper works for both the detokenizer and the chat template."""
    tokenizer_utils = pytest.importorskip("mlx_lm.tokenizer_utils")
    wrapped = tokenizer_utils.TokenizerWrapper(tokenizer)
    messages = [{"role": "user", "content": "你好 🦀"}]
    assert apply_chat_template(wrapped, messages) == apply_chat_template(tokenizer, messages)
    ids = tokenizer.encode("wrapped 🦀 你好", add_special_tokens=False)
    deltas, tail, _ = stream(wrapped, [[i] for i in ids])
    assert "".join(deltas) + tail == "wrapped 🦀 你好"


def test_stop_matcher_says_which_stop_ended_the_text():
    """`matched` is the stop string that ended the text, and None until one has (a candidate held back
    for an earlier-starting, longer stop does not count yet)."""
    m = StopMatcher(["abcd", "c"])
    assert m.push("ab") == ("", False) and m.matched is None
    assert m.push("c") == ("", False) and m.matched is None  # "c" matched, but "abcd" may still complete
    assert m.push("x") == ("ab", True) and m.matched == "c"
    done = StopMatcher(["END", "STOP"])
    assert done.push("text STOP more END") == ("text ", True) and done.matched == "STOP"
    assert StopMatcher(["zz"]).matched is None
