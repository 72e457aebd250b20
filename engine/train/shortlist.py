"""The draft-vocabulary shortlist of the distillation loss (issue 18, "compute where it pays").

The drafter's output head is the target's 49,152 x 576 embedding, and the head product with its
softmax over the whole vocabulary is most of a training step. With a shortlist, each step's KD
runs over the columns

    C = shortlist ∪ {the target's top-k ids of every row in the batch} ∪ {every row's label}

(sorted, one set for the whole batch): the drafter's distribution is renormalised over C, and
`engine.train.loss.kd_rows` compares it with the target's top-k, label and rest buckets exactly as
over the full vocabulary. Every token the target gives top-k mass, and every label, is always a
column, so the shortlist only decides which *other* tokens the drafter learns to push down. The
shortlist is the ``size`` most frequent labels of the training samples (a pure function of the
samples, so a resumed run rebuilds the same one).

The shortlist is saved beside the drafter's weights (``shortlist.json``, `engine.loading.drafter`),
and serving drafts from it (`engine.models.drafter.draft_rows`; docs/method.md §3.6). The trainer's
held-out instruments and gate form drafts over the whole vocabulary and report how often the
argmax falls outside the shortlist; the held-out rounds load the saved drafter as serving does.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from engine.train.batch import Columns, Teacher
from engine.train.data import Sample


def frequent_tokens(samples: list[Sample], size: int, vocab_size: int) -> np.ndarray:
    """The ``size`` most frequent labels (ids[1:] of each sample) [<= size] int32, sorted by id.

    Ties go to the smaller id (a stable sort), so the list is a pure function of the samples.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    for s in samples:
        counts += np.bincount(s.ids[1:], minlength=vocab_size)[:vocab_size]
    order = np.argsort(-counts, kind="stable")[: min(size, vocab_size)]
    return np.sort(order[counts[order] > 0]).astype(np.int32)


def label_coverage(shortlist: np.ndarray, samples: list[Sample]) -> float:
    """Share of the samples' labels (ids[1:]) inside the shortlist."""
    inside = total = 0
    for s in samples:
        inside += int(np.isin(s.ids[1:], shortlist).sum())
        total += len(s) - 1
    return inside / max(total, 1)


def batch_columns(shortlist: np.ndarray, teacher: Teacher, labels: np.ndarray) -> Columns:
    """The loss columns of a batch (shortlist ∪ its rows' top-k ids ∪ labels) and its targets
    mapped into them. ``teacher`` holds token ids [R, k], ``labels`` [R] token ids."""
    ids = np.array(teacher.ids)  # [R, k]
    vocab = np.union1d(shortlist, np.concatenate([ids.reshape(-1), labels])).astype(np.int32)  # [C] sorted
    mapped = np.searchsorted(vocab, ids).astype(np.int32)  # [R, k]: exact, every id is in vocab
    cols = Teacher(mx.array(mapped), teacher.logp, teacher.label_logp)
    return Columns(mx.array(vocab), mx.array(np.searchsorted(vocab, labels).astype(np.int32)), cols)
