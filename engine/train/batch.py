"""Anchor blocks for one training step (docs/method.md §8).

For an anchor a of a sample with ids x and loss mask m:
  * the block input is ``[x_a, M, ..., M]`` (``Bs`` slots) at positions ``a .. a+Bs-1``;
  * draft k (1-based, k = 1..Bd) sits at slot ``offset + k - 1`` and is labelled ``x_{a+k}``;
  * its Markov previous id is teacher-forced: ``x_{a+k-1}`` (the anchor for k = 1);
  * the target distribution for it is the target's row ``a+k-1`` (``lm_head(hidden[a+k-1])``);
  * it counts while ``a+k`` is inside the sample and in the loss mask, and only as part of a
    contiguous valid prefix (the eval mask is a cumulative product along k);
  * its weight is ``exp(-(k-1)/decay)``.
Anchors are sampled where both ``m[a]`` and ``m[a+1]`` hold, and ``a >= 1`` so every block has
context, as in serving (the first anchor follows the prompt).
Only valid draft rows are kept (``rows``), so the vocabulary-sized head runs on nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from engine.train.data import Sample


@dataclass
class BlockBatch:
    """One step's anchor blocks; b samples x N anchors, Bs slots, Bd drafts, R valid draft rows."""

    taps: mx.array  # [b, W, m*d] target taps (zero-padded to width W)
    hidden: mx.array  # [b, W, d] target final hidden state
    block_ids: mx.array  # [b*N, Bs] anchor then masks
    anchors: mx.array  # [b*N] anchor positions
    attn_mask: mx.array  # [b, 1, N*Bs, W + N*Bs] bool: context < anchor, plus the own block
    rows: mx.array  # [R] index into the [b*N*Bd] draft rows
    labels: mx.array  # [R] ground-truth token of each draft row
    prev_ids: mx.array  # [R] teacher-forced previous token (Markov and confidence input)
    target_rows: mx.array  # [R] index into the [b*W] hidden rows: the target's distribution
    target_unique: mx.array  # [U] the distinct target_rows (overlapping blocks share them)
    target_inverse: mx.array  # [R] position of each row's target row in target_unique
    weights: mx.array  # [R] exp(-(k-1)/decay)
    position: np.ndarray  # [R] k - 1 (0-based draft position)
    block: np.ndarray  # [R] block index in [0, b*N)
    num_blocks: int  # b*N
    num_drafts: int  # Bd
    teacher: Teacher | None = None  # the target's cached top-k of each row (distillation only)
    columns: Columns | None = None  # the loss's shortlist columns (distillation with a shortlist only)


@dataclass
class Teacher:
    """The target's cached view of each draft row (R rows, k candidates; see `features.target_topk`)."""

    ids: mx.array  # [R, k] int32 the target's top-k tokens, likeliest first
    logp: mx.array  # [R, k] float32 their log-probabilities under the target
    label_logp: mx.array  # [R] float32 the target's log-probability of the row's label

    def rows(self, index: mx.array) -> Teacher:
        """The teacher of a subset of rows."""
        return Teacher(self.ids[index], self.logp[index], self.label_logp[index])


@dataclass
class Columns:
    """A batch's draft-shortlist loss columns (`engine.train.shortlist`) and its targets in them."""

    vocab: mx.array  # [C] int32 sorted token ids: the columns of the restricted logits
    labels: mx.array  # [R] int32 column of each row's label
    teacher: Teacher  # ids [R, k]: columns of the target's top-k (log-probs as in the full teacher)


def gather_teacher(ids: mx.array, logp: mx.array, next_logp: mx.array, target_rows: mx.array) -> Teacher:
    """The `Teacher` of each draft row from per-position top-k ids / log-probs [b, W, k] and the
    next-token log-prob [b, W]; ``target_rows`` [R] index the [b*W] positions. The next token of
    target row a+k-1 is x_{a+k}, the row's label."""
    k = ids.shape[-1]
    return Teacher(ids.reshape(-1, k)[target_rows], logp.reshape(-1, k)[target_rows],
                   next_logp.reshape(-1)[target_rows])


def valid_anchors(sample: Sample) -> np.ndarray:
    """Positions a >= 1 with loss_mask[a] and loss_mask[a+1] (at least one label to learn)."""
    m = sample.loss_mask
    ok = m[:-1] & m[1:]
    ok[0] = False
    return np.nonzero(ok)[0]


def sample_anchors(sample: Sample, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` sorted anchors: distinct when there are enough valid ones, else all plus repeats."""
    valid = valid_anchors(sample)
    if valid.size == 0:
        raise ValueError("sample has no valid anchor (needs two consecutive loss-mask tokens)")
    if valid.size >= n:
        return np.sort(rng.choice(valid, n, replace=False))
    return np.sort(np.concatenate([valid, rng.choice(valid, n - valid.size, replace=True)]))


def build_batch(samples: list[Sample], taps: mx.array, hidden: mx.array, anchors: np.ndarray, *,
                block_slots: int, slot_offset: int, mask_token_id: int, decay: float,
                max_position: int | None = None) -> BlockBatch:
    """Assemble a `BlockBatch` from samples, their features and anchors [b, N].

    ``max_position`` keeps only draft positions k <= max_position (the position curriculum: the
    vocabulary-wide head then runs on those rows only).
    """
    b, n = anchors.shape
    width = int(taps.shape[1])
    drafts = block_slots - slot_offset
    block_ids = np.full((b * n, block_slots), mask_token_id, dtype=np.int32)
    block_ids[:, 0] = np.concatenate([s.ids[a] for s, a in zip(samples, anchors)])
    cols = _draft_rows(samples, anchors, width, drafts)
    if max_position is not None:
        keep = cols[4] < max_position
        cols = tuple(c[keep] for c in cols)
    rows, labels, prev_ids, target_rows, position, block = cols
    unique, inverse = np.unique(target_rows, return_inverse=True)
    return BlockBatch(
        taps=taps, hidden=hidden, block_ids=mx.array(block_ids), anchors=mx.array(anchors.reshape(-1)),
        attn_mask=mx.array(attention_mask(anchors, width, block_slots)),
        rows=mx.array(rows), labels=mx.array(labels), prev_ids=mx.array(prev_ids),
        target_rows=mx.array(target_rows), target_unique=mx.array(unique.astype(np.int32)),
        target_inverse=mx.array(inverse.astype(np.int32).reshape(-1)), weights=mx.array(np.exp(-position / decay).astype(np.float32)),
        position=position, block=block, num_blocks=b * n, num_drafts=drafts)


def attention_mask(anchors: np.ndarray, width: int, block_slots: int) -> np.ndarray:
    """[b, 1, N*Bs, W + N*Bs] bool: row (n, j) sees context s < anchors[n] and block n only."""
    b, n = anchors.shape
    ctx = np.arange(width)[None, None, :] < anchors[:, :, None]  # [b, N, W]
    ctx = np.repeat(ctx, block_slots, axis=1)  # [b, N*Bs, W]
    owner = np.repeat(np.arange(n), block_slots)  # [N*Bs] block of each row / key
    own = np.broadcast_to(owner[:, None] == owner[None, :], (b, n * block_slots, n * block_slots))
    return np.concatenate([ctx, own], axis=2)[:, None]


def _draft_rows(samples: list[Sample], anchors: np.ndarray, width: int, drafts: int) -> tuple[np.ndarray, ...]:
    """Flat (rows, labels, prev_ids, target_rows, position, block) of every valid draft row."""
    out: list[list[np.ndarray]] = [[] for _ in range(6)]
    n = anchors.shape[1]
    k = np.arange(1, drafts + 1)  # [Bd]
    for i, (sample, seq_anchors) in enumerate(zip(samples, anchors)):
        pos = seq_anchors[:, None] + k[None, :]  # [N, Bd] label positions a + k
        inside = pos < len(sample)
        valid = inside & sample.loss_mask[np.minimum(pos, len(sample) - 1)]
        valid = np.cumprod(valid, axis=1).astype(bool)  # only a contiguous valid prefix counts
        blk, kk = np.nonzero(valid)  # kk = k - 1
        label_pos = pos[blk, kk]
        out[0].append((i * n + blk) * drafts + kk)
        out[1].append(sample.ids[label_pos])
        out[2].append(sample.ids[label_pos - 1])
        out[3].append(i * width + label_pos - 1)
        out[4].append(kk)
        out[5].append(i * n + blk)
    return tuple(np.concatenate(col).astype(np.int32) for col in out)
