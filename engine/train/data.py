"""Training samples: token ids with a loss mask, from text files or JSONL prompts.

Plain text trains on every token; chat data trains on the answer (assistant or target-generated)
tokens only, as DeepSpec's loss mask does (docs/method.md §8). Prompt records are one JSON object a line:
``{"messages": [...]}`` (chat-templated; a trailing assistant message is the answer),
``{"prompt": "..."}`` (one user turn, chat-templated) or ``{"text": "..."}`` (raw, no template).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.text import apply_chat_template

log = logging.getLogger(__name__)

# Files read when a directory is given (explicit files are read whatever their suffix).
TEXT_SUFFIXES = (".txt", ".rst", ".md", ".py")


@dataclass
class Sample:
    """One training sequence: ids [S] and a loss mask [S] (True = the drafter learns this token)."""

    ids: np.ndarray  # [S] int32
    loss_mask: np.ndarray  # [S] bool

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int32)
        self.loss_mask = np.asarray(self.loss_mask, dtype=bool)
        if self.ids.shape != self.loss_mask.shape or self.ids.ndim != 1:
            raise ValueError(f"ids {self.ids.shape} and loss_mask {self.loss_mask.shape} must be equal 1-D")

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        """Tokens the loss covers."""
        return int(self.loss_mask.sum())


@dataclass
class Prompt:
    """A prompt (already templated) and, when the record had one, its reference answer ids."""

    ids: list[int]
    answer: list[int] | None = None


# ---------------------------------------------------------------- text


def list_text_files(paths: list[str | Path], exclude: tuple[str, ...] = ()) -> list[Path]:
    """Files named directly, plus every TEXT_SUFFIXES file under the directories; sorted, unique.

    A file found under a directory is skipped when any part of its path below that directory
    matches an ``exclude`` glob (e.g. "test", "idlelib", "test_*.py").
    """
    out: set[Path] = set()
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            out.update(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TEXT_SUFFIXES)
                       and not _excluded(p.relative_to(path), exclude))
        elif path.is_file():
            out.add(path)
        else:
            raise FileNotFoundError(f"training data {path} does not exist")
    return sorted(out)


def _excluded(relative: Path, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in relative.parts for pat in patterns)


def heldout_by_path(path: Path) -> bool:
    """The 1-in-10 held-out split of ``scripts/make_prompts.py`` (sha1 of the absolute path)."""
    return hashlib.sha1(str(path).encode()).digest()[0] % 10 == 0


def _squash(text: str) -> str:
    # Whitespace-insensitive matching: prompt builders re-indent code and strip paragraphs.
    return re.sub(r"\s+", " ", text).strip()


def heldout_passages(records: list[dict], min_chars: int = 100) -> list[str]:
    """The quoted passages of held-out prompt records (text after the instruction, fences removed).

    Passages shorter than ``min_chars`` (chat topics such as "What is X?") are left out: they are
    phrases, and excluding every file that mentions one would drop most of the corpus.
    """
    return [_squash(p) for p in map(record_passage, records) if len(p) >= min_chars]


def record_passage(record: dict) -> str:
    """The passage a prompt record quotes: its first message after the instruction line, code
    fences removed (the whole text when there is no instruction)."""
    messages = record.get("messages") or [{"content": record.get("prompt") or record.get("text", "")}]
    body = messages[0].get("content", "").split("\n\n", 1)[-1]
    return re.sub(r"^```\w*\n|\n```$", "", body.strip())


def passage_samples(records: list[dict], tokenizer, limit: int, seq_len: int, min_len: int) -> list[Sample]:
    """Plain-text samples (every token trained on) of the first ``limit`` passages of ``records``
    that tokenize to at least ``min_len`` tokens: held-out text the trainer's instruments score."""
    out = []
    for record in records:
        ids = list(tokenizer.encode(record_passage(record)))[:seq_len]
        if len(ids) >= min_len:
            out.append(Sample(ids, np.ones(len(ids), dtype=bool)))
        if len(out) == limit:
            break
    return out


def drop_heldout_files(files: list[Path], passages: list[str]) -> tuple[list[Path], int]:
    """(kept files, number dropped): a file is dropped when it is in the held-out path split or
    contains any held-out passage, so no held-out prompt's text is ever trained on."""
    kept = []
    for path in files:
        if heldout_by_path(path):
            continue
        try:
            text = _squash(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        if not any(p in text for p in passages):
            kept.append(path)
    return kept, len(files) - len(kept)


def chunk_ids(ids: list[int], seq_len: int, min_len: int) -> list[Sample]:
    """Split one document's ids into consecutive chunks of ``seq_len``; drop a tail < ``min_len``."""
    chunks = [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]
    return [Sample(c, np.ones(len(c), dtype=bool)) for c in chunks if len(c) >= min_len]


def text_samples(files: list[Path], tokenizer, seq_len: int, min_len: int) -> list[Sample]:
    """Every file tokenized on its own and chunked; unreadable (binary) files are skipped."""
    samples: list[Sample] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as exc:
            log.warning("skipping %s: %s", path, exc)
            continue
        if text.strip():
            samples.extend(chunk_ids(list(tokenizer.encode(text)), seq_len, min_len))
    return samples


# ---------------------------------------------------------------- prompts


def read_prompt_records(path: str | Path) -> list[dict]:
    """JSON objects, one a line (blank lines skipped); errors name the line."""
    records = []
    for num, line in enumerate(Path(path).expanduser().read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{num}: not JSON: {exc}") from exc
        if not isinstance(record, dict) or not ({"messages", "prompt", "text"} & record.keys()):
            raise ValueError(f"{path}:{num}: expected an object with 'messages', 'prompt' or 'text'")
        records.append(record)
    return records


def record_prompt(record: dict, tokenizer) -> Prompt:
    """Template one record: the prompt ids (generation prompt added) and the answer ids if any."""
    if "text" in record:
        return Prompt(list(tokenizer.encode(record["text"])))
    messages = record.get("messages") or [{"role": "user", "content": record["prompt"]}]
    if messages[-1].get("role") != "assistant":
        return Prompt(apply_chat_template(tokenizer, messages))
    prompt = apply_chat_template(tokenizer, messages[:-1])
    full = apply_chat_template(tokenizer, messages, add_generation_prompt=False)
    if full[: len(prompt)] == prompt:
        return Prompt(prompt, full[len(prompt) :])
    return Prompt(prompt, list(tokenizer.encode(messages[-1].get("content", ""))))


def answer_sample(prompt: list[int], answer: list[int], seq_len: int) -> Sample | None:
    """Prompt + answer, mask on the answer, cut to ``seq_len`` (the prompt loses its oldest tokens)."""
    if not answer:
        return None
    keep_prompt = max(1, min(len(prompt), seq_len - min(len(answer), seq_len // 2)))
    ids = prompt[-keep_prompt:] + answer
    mask = [False] * keep_prompt + [True] * len(answer)
    return Sample(ids[:seq_len], mask[:seq_len])


# ---------------------------------------------------------------- persistence and splits


def save_samples(samples: list[Sample], path: Path) -> None:
    """JSONL of {"ids": [...], "mask": [0/1...]}, written atomically."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as fh:
        for s in samples:
            fh.write(json.dumps({"ids": s.ids.tolist(), "mask": s.loss_mask.astype(int).tolist()}) + "\n")
    tmp.replace(path)


def load_samples(path: Path) -> list[Sample]:
    """Inverse of `save_samples`."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.append(Sample(row["ids"], row["mask"]))
    return out


def split_heldout(samples: list[Sample], num_heldout: int, seed: int) -> tuple[list[Sample], list[Sample]]:
    """(train, held-out): a seeded random ``num_heldout`` samples are held out, order kept."""
    if num_heldout <= 0:
        return list(samples), []
    if num_heldout >= len(samples):
        raise ValueError(f"cannot hold out {num_heldout} of {len(samples)} samples")
    chosen = set(np.random.default_rng([seed, 7]).choice(len(samples), num_heldout, replace=False).tolist())
    train = [s for i, s in enumerate(samples) if i not in chosen]
    held = [s for i, s in enumerate(samples) if i in chosen]
    return train, held


def subsample(samples: list[Sample], limit: int | None, seed: int) -> list[Sample]:
    """A seeded random ``limit`` samples (all when limit is None or larger), original order kept."""
    if limit is None or limit >= len(samples):
        return samples
    keep = np.sort(np.random.default_rng([seed, 11]).choice(len(samples), limit, replace=False))
    return [samples[i] for i in keep]


def heldout_prompt(sample: Sample, max_prompt: int) -> list[int]:
    """A prompt from a held-out sample: its unmasked prefix (chat), or its first half (plain text)."""
    first = int(np.argmax(sample.loss_mask)) if sample.loss_mask.any() else len(sample)
    cut = first if first > 0 else max(1, len(sample) // 2)
    return sample.ids[: cut][-max_prompt:].tolist()
